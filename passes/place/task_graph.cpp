// buildTaskGraph: tasks, tensors, storage classes and groups for the placers
// (Note [Memory model] in task_graph.h). Works on flat arrays and sorted
// (key, item) pairs, so a 100k-node graph builds in tens of milliseconds.
#include "passes/place/task_graph.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "ir/check.h"
#include "passes/place/flat_graph.h"

namespace modelpar::passes {
namespace {

using Pair = std::pair<int32_t, int32_t>;

// Sorts and dedupes (key, item) pairs into a CSR over keys 0..num_keys-1.
void pairsToCsr(std::vector<Pair>& pairs, size_t num_keys, std::vector<int32_t>& begin,
                std::vector<int32_t>& items) {
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  begin.assign(num_keys + 1, 0);
  for (const Pair& p : pairs) ++begin[static_cast<size_t>(p.first) + 1];
  for (size_t k = 0; k < num_keys; ++k) begin[k + 1] += begin[k];
  items.resize(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) items[i] = pairs[i].second;
}

// Builds the TaskGraph of a graph and its grouping, one method per step.
class TaskGraphBuilder {
 public:
  TaskGraphBuilder(const ir::Graph& g, const Coarsening& c)
      : g_(g), c_(c), f_(flatten(g)), num_nodes_(g.numNodes()), num_values_(g.numValues()),
        num_tasks_(static_cast<size_t>(c.num_units)) {}

  TaskGraph run() {
    addMembers();
    findReads();
    addStorages();
    addEdges();
    orderTasks();
    addGroups();
    return std::move(t_);
  }

 private:
  int32_t taskOf(ir::NodeId n) const { return c_.unit_of_node[static_cast<size_t>(n)]; }

  // 1. Members, times and group of each task.
  void addMembers() {
    t_.time_us.assign(num_tasks_, 0.0);
    t_.out_bytes.assign(num_tasks_, 0);
    t_.temp_bytes.assign(num_tasks_, 0);
    t_.persistent_bytes.assign(num_tasks_, 0);
    t_.group.assign(num_tasks_, -1);
    std::vector<Pair> pairs;
    pairs.reserve(num_nodes_);
    for (size_t i = 0; i < num_nodes_; ++i) {
      MP_CHECK(g_.nodes()[i].cost.has_value(), ConfigError,
               "modelpar place: node {} ({}) has no cost; run the cost pass first",
               g_.nodeRef(static_cast<ir::NodeId>(i)), g_.nodes()[i].qualifiedName());
      auto u = static_cast<size_t>(c_.unit_of_node[i]);
      MP_CHECK(u < num_tasks_, ConfigError, "modelpar place: node {} is in unit {} of {}",
               g_.nodeRef(static_cast<ir::NodeId>(i)), u, num_tasks_);
      int32_t grp = c_.group_of_node[i];
      MP_CHECK(t_.group[u] == -1 || t_.group[u] == grp, ConfigError,
               "modelpar place: unit {} spans colocation groups {} and {}", u, t_.group[u], grp);
      t_.group[u] = grp;
      pairs.emplace_back(static_cast<int32_t>(u), static_cast<int32_t>(i));
      t_.time_us[u] += f_.time_us[i];
      t_.persistent_bytes[u] += f_.persistent_bytes[i];
      t_.temp_bytes[u] = std::max(t_.temp_bytes[u], f_.temp_bytes[i]);
    }
    pairsToCsr(pairs, num_tasks_, t_.member_begin, t_.members);
    for (size_t u = 0; u < num_tasks_; ++u) {
      MP_CHECK(t_.member_begin[u] < t_.member_begin[u + 1], ConfigError,
               "modelpar place: unit {} has no nodes", u);
    }
  }

  // 2. Reads: which tasks read each storage class; tensors crossing tasks.
  void findReads() {
    const std::vector<ir::ValueId>& root = f_.storage_root;
    producer_.assign(num_values_, -1);
    for (size_t n = 0; n < num_nodes_; ++n) {
      for (int32_t k = f_.out_begin[n]; k < f_.out_begin[n + 1]; ++k) {
        producer_[static_cast<size_t>(f_.outs[static_cast<size_t>(k)])] = taskOf(static_cast<ir::NodeId>(n));
      }
    }
    escapes_.assign(num_values_, 0);
    kept_.assign(num_values_, 0);
    std::vector<int32_t> tensor_of(num_values_, -1);
    std::vector<Pair> reads, task_inputs;  // (root, task), (task, tensor)
    reads.reserve(f_.args.size());
    for (size_t n = 0; n < num_nodes_; ++n) {
      int32_t task = taskOf(static_cast<ir::NodeId>(n));
      for (int32_t k = f_.arg_begin[n]; k < f_.arg_begin[n + 1]; ++k) {
        auto v = static_cast<size_t>(f_.args[static_cast<size_t>(k)]);
        auto r = static_cast<size_t>(root[v]);
        reads.emplace_back(static_cast<int32_t>(r), task);
        if (producer_[v] == task) continue;
        escapes_[r] = 1;
        if (tensor_of[v] == -1) {
          tensor_of[v] = static_cast<int32_t>(t_.tensors.size());
          t_.tensors.push_back({static_cast<ir::ValueId>(v), producer_[v], -1, -1, f_.dense_bytes[v]});
        }
        task_inputs.emplace_back(task, tensor_of[v]);
      }
    }
    pairsToCsr(reads, num_values_, reader_begin_, reader_tasks_);
    pairsToCsr(task_inputs, num_tasks_, t_.input_begin, t_.inputs);
    for (ir::ValueId v : g_.outputs()) {
      auto r = static_cast<size_t>(root[static_cast<size_t>(v)]);
      kept_[r] = escapes_[r] = 1;
    }
  }

  // 3. Storages: graph inputs, then escaping classes; internal classes are
  // temporaries of the task that allocates them.
  void addStorages() {
    const std::vector<ir::ValueId>& root = f_.storage_root;
    std::vector<int32_t> storage_of(num_values_, -1);
    std::vector<char> is_input(num_values_, 0);
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      const ir::Input& in = g_.inputs()[i];
      auto v = static_cast<size_t>(in.value);
      is_input[v] = 1;
      TaskGraph::Storage s;
      s.input_index = static_cast<int32_t>(i);
      s.kept = true;
      s.persistent_input = in.role == ir::InputRole::Input;
      s.bytes = s.persistent_input ? f_.dense_bytes[v] : 0;
      s.output = kept_[v] != 0;
      storage_of[v] = static_cast<int32_t>(t_.storages.size());
      t_.storages.push_back(s);
    }
    for (size_t v = 0; v < num_values_; ++v) {
      if (is_input[v] || root[v] != static_cast<ir::ValueId>(v) || producer_[v] < 0) continue;
      // A root allocates, unless it is the fresh output of an alias op with no base.
      int64_t bytes = f_.storage_bytes[v];
      if (!escapes_[v]) {
        t_.temp_bytes[static_cast<size_t>(producer_[v])] += bytes;
        continue;
      }
      TaskGraph::Storage s;
      s.producer = producer_[v];
      s.bytes = bytes;
      s.kept = s.output = kept_[v] != 0;
      storage_of[v] = static_cast<int32_t>(t_.storages.size());
      t_.storages.push_back(s);
    }
    size_t num_storages = t_.storages.size();
    std::vector<Pair> storage_tensors, releases, allocs;
    for (size_t x = 0; x < t_.tensors.size(); ++x) {
      TaskGraph::Tensor& ten = t_.tensors[x];
      ten.storage = storage_of[static_cast<size_t>(root[static_cast<size_t>(ten.value)])];
      MP_INTERNAL_ASSERT(ten.storage >= 0, "tensor %{} has no storage", g_.value(ten.value).name);
      if (ten.producer < 0) ten.input_index = t_.storages[static_cast<size_t>(ten.storage)].input_index;
      storage_tensors.emplace_back(ten.storage, static_cast<int32_t>(x));
    }
    t_.storage_readers.assign(num_storages, 0);
    for (size_t v = 0; v < num_values_; ++v) {
      int32_t s = storage_of[v];
      if (s < 0) continue;
      const TaskGraph::Storage& st = t_.storages[static_cast<size_t>(s)];
      t_.storage_readers[static_cast<size_t>(s)] = reader_begin_[v + 1] - reader_begin_[v];
      if (st.producer >= 0) {
        allocs.emplace_back(st.producer, s);
        t_.out_bytes[static_cast<size_t>(st.producer)] += st.bytes;
      }
      if (st.kept) continue;
      for (int32_t k = reader_begin_[v]; k < reader_begin_[v + 1]; ++k) {
        releases.emplace_back(reader_tasks_[static_cast<size_t>(k)], s);
      }
    }
    pairsToCsr(storage_tensors, num_storages, t_.storage_tensor_begin, t_.storage_tensors);
    pairsToCsr(releases, num_tasks_, t_.release_begin, t_.releases);
    pairsToCsr(allocs, num_tasks_, t_.alloc_begin, t_.allocs);
  }

  // 4. Edges: data (with bytes) and in-place ordering (0 bytes).
  void addEdges() {
    std::vector<std::pair<Pair, int64_t>> edges;  // ((from, to), bytes)
    for (size_t task = 0; task < num_tasks_; ++task) {
      for (int32_t x : t_.inputsOf(static_cast<int32_t>(task))) {
        const TaskGraph::Tensor& ten = t_.tensors[static_cast<size_t>(x)];
        if (ten.producer >= 0) edges.push_back({{ten.producer, static_cast<int32_t>(task)}, ten.bytes});
      }
    }
    for (auto [m, n] : inPlaceOrderEdges(f_)) {
      int32_t a = taskOf(m), b = taskOf(n);
      if (a != b) edges.push_back({{a, b}, 0});
    }
    std::sort(edges.begin(), edges.end());
    std::vector<Pair> succ_pairs, pred_pairs;
    for (size_t k = 0; k < edges.size();) {
      Pair e = edges[k].first;
      int64_t bytes = 0;
      for (; k < edges.size() && edges[k].first == e; ++k) bytes += edges[k].second;
      succ_pairs.push_back(e);
      t_.succ_bytes.push_back(bytes);  // edges are sorted by (from, to): CSR order
      pred_pairs.emplace_back(e.second, e.first);
    }
    pairsToCsr(succ_pairs, num_tasks_, t_.succ_begin, t_.succs);
    pairsToCsr(pred_pairs, num_tasks_, t_.pred_begin, t_.preds);
  }

  // 5. Kahn's order (BFS, ties by task id = first node in graph order).
  void orderTasks() {
    std::vector<int32_t> indeg(num_tasks_);
    std::deque<int32_t> queue;
    for (size_t u = 0; u < num_tasks_; ++u) {
      indeg[u] = t_.pred_begin[u + 1] - t_.pred_begin[u];
      if (indeg[u] == 0) queue.push_back(static_cast<int32_t>(u));
    }
    t_.rank.assign(num_tasks_, -1);
    t_.topo.reserve(num_tasks_);
    while (!queue.empty()) {
      int32_t u = queue.front();
      queue.pop_front();
      t_.rank[static_cast<size_t>(u)] = static_cast<int32_t>(t_.topo.size());
      t_.topo.push_back(u);
      for (int32_t v : t_.succsOf(u)) {
        if (--indeg[static_cast<size_t>(v)] == 0) queue.push_back(v);
      }
    }
    if (t_.topo.size() == num_tasks_) return;
    for (size_t u = 0; u < num_tasks_; ++u) {
      if (t_.rank[u] >= 0) continue;
      MP_THROW(ConfigError,
               "modelpar place: the grouping of graph @{} has a cycle through unit {} (node {}); "
               "units must form a DAG", g_.name(), u, g_.nodeRef(t_.membersOf(static_cast<int32_t>(u))[0]));
    }
  }

  // 6. Groups: names, persistent bytes, tasks.
  void addGroups() {
    auto num_groups = static_cast<size_t>(c_.num_groups);
    t_.group_name.assign(num_groups, "");
    t_.group_persistent.assign(num_groups, 0);
    std::vector<Pair> group_tasks;
    for (size_t u = 0; u < num_tasks_; ++u) {
      auto grp = static_cast<size_t>(t_.group[u]);
      MP_CHECK(grp < num_groups, ConfigError, "modelpar place: unit {} is in group {} of {}", u,
               grp, num_groups);
      group_tasks.emplace_back(static_cast<int32_t>(grp), static_cast<int32_t>(u));
      t_.group_persistent[grp] += t_.persistent_bytes[u];
    }
    pairsToCsr(group_tasks, num_groups, t_.group_task_begin, t_.group_tasks);
    std::vector<int32_t> first_node(num_groups, std::numeric_limits<int32_t>::max());
    for (size_t n = 0; n < num_nodes_; ++n) {
      auto grp = static_cast<size_t>(t_.group[static_cast<size_t>(c_.unit_of_node[n])]);
      const std::string& layer = g_.nodes()[n].layer;
      if (t_.group_name[grp].empty() && !layer.empty()) t_.group_name[grp] = layer;
      first_node[grp] = std::min(first_node[grp], static_cast<int32_t>(n));
    }
    for (size_t grp = 0; grp < num_groups; ++grp) {
      if (t_.group_name[grp].empty() && first_node[grp] != std::numeric_limits<int32_t>::max()) {
        t_.group_name[grp] = g_.nodeRef(first_node[grp]);
      }
    }
  }

  const ir::Graph& g_;
  const Coarsening& c_;
  const FlatGraph f_;
  const size_t num_nodes_, num_values_, num_tasks_;
  TaskGraph t_;
  // From step 2: each value's producing task; per storage root, whether it
  // leaves its task and whether the graph returns it; the readers' CSR.
  std::vector<int32_t> producer_;
  std::vector<char> escapes_, kept_;
  std::vector<int32_t> reader_begin_, reader_tasks_;
};

}  // namespace

TaskGraph buildTaskGraph(const ir::Graph& g, const Coarsening* c) {
  Coarsening own;
  if (c == nullptr) {
    own = nodeUnits(g);
    c = &own;
  }
  MP_CHECK(c->unit_of_node.size() == g.numNodes() && c->group_of_node.size() == g.numNodes(),
           ConfigError, "modelpar place: the grouping covers {} nodes but graph @{} has {}",
           c->unit_of_node.size(), g.name(), g.numNodes());
  return TaskGraphBuilder(g, *c).run();
}

}  // namespace modelpar::passes
