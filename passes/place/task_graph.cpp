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

}  // namespace

TaskGraph buildTaskGraph(const ir::Graph& g, const Coarsening* c) {
  Coarsening own;
  if (c == nullptr) {
    own = nodeUnits(g);
    c = &own;
  }
  size_t num_nodes = g.numNodes();
  MP_CHECK(c->unit_of_node.size() == num_nodes && c->group_of_node.size() == num_nodes,
           ConfigError, "modelpar place: the grouping covers {} nodes but graph @{} has {}",
           c->unit_of_node.size(), g.name(), num_nodes);
  FlatGraph f = flatten(g);
  auto num_tasks = static_cast<size_t>(c->num_units);
  TaskGraph t;
  t.time_us.assign(num_tasks, 0.0);
  t.out_bytes.assign(num_tasks, 0);
  t.temp_bytes.assign(num_tasks, 0);
  t.persistent_bytes.assign(num_tasks, 0);
  t.group.assign(num_tasks, -1);

  // 1. Members, times and group of each task.
  std::vector<Pair> pairs;
  pairs.reserve(num_nodes);
  for (size_t i = 0; i < num_nodes; ++i) {
    MP_CHECK(g.nodes()[i].cost.has_value(), ConfigError,
             "modelpar place: node {} ({}) has no cost; run the cost pass first",
             g.nodeRef(static_cast<ir::NodeId>(i)), g.nodes()[i].qualifiedName());
    auto u = static_cast<size_t>(c->unit_of_node[i]);
    MP_CHECK(u < num_tasks, ConfigError, "modelpar place: node {} is in unit {} of {}",
             g.nodeRef(static_cast<ir::NodeId>(i)), u, num_tasks);
    int32_t grp = c->group_of_node[i];
    MP_CHECK(t.group[u] == -1 || t.group[u] == grp, ConfigError,
             "modelpar place: unit {} spans colocation groups {} and {}", u, t.group[u], grp);
    t.group[u] = grp;
    pairs.emplace_back(static_cast<int32_t>(u), static_cast<int32_t>(i));
    t.time_us[u] += f.time_us[i];
    t.persistent_bytes[u] += f.persistent_bytes[i];
    t.temp_bytes[u] = std::max(t.temp_bytes[u], f.temp_bytes[i]);
  }
  pairsToCsr(pairs, num_tasks, t.member_begin, t.members);
  for (size_t u = 0; u < num_tasks; ++u) {
    MP_CHECK(t.member_begin[u] < t.member_begin[u + 1], ConfigError,
             "modelpar place: unit {} has no nodes", u);
  }
  auto task_of = [&](ir::NodeId n) { return c->unit_of_node[static_cast<size_t>(n)]; };

  // 2. Reads: which tasks read each storage class; tensors crossing tasks.
  const std::vector<ir::ValueId>& root = f.storage_root;
  size_t num_values = g.numValues();
  std::vector<int32_t> producer(num_values, -1);
  for (size_t n = 0; n < num_nodes; ++n) {
    for (int32_t k = f.out_begin[n]; k < f.out_begin[n + 1]; ++k) {
      producer[static_cast<size_t>(f.outs[static_cast<size_t>(k)])] = task_of(static_cast<ir::NodeId>(n));
    }
  }
  std::vector<char> escapes(num_values, 0), kept(num_values, 0);
  std::vector<int32_t> tensor_of(num_values, -1);
  std::vector<Pair> reads, task_inputs;  // (root, task), (task, tensor)
  reads.reserve(f.args.size());
  for (size_t n = 0; n < num_nodes; ++n) {
    int32_t task = task_of(static_cast<ir::NodeId>(n));
    for (int32_t k = f.arg_begin[n]; k < f.arg_begin[n + 1]; ++k) {
      auto v = static_cast<size_t>(f.args[static_cast<size_t>(k)]);
      auto r = static_cast<size_t>(root[v]);
      reads.emplace_back(static_cast<int32_t>(r), task);
      if (producer[v] == task) continue;
      escapes[r] = 1;
      if (tensor_of[v] == -1) {
        tensor_of[v] = static_cast<int32_t>(t.tensors.size());
        t.tensors.push_back({static_cast<ir::ValueId>(v), producer[v], -1, -1, f.dense_bytes[v]});
      }
      task_inputs.emplace_back(task, tensor_of[v]);
    }
  }
  std::vector<int32_t> reader_begin, reader_tasks;
  pairsToCsr(reads, num_values, reader_begin, reader_tasks);
  pairsToCsr(task_inputs, num_tasks, t.input_begin, t.inputs);
  for (ir::ValueId v : g.outputs()) {
    auto r = static_cast<size_t>(root[static_cast<size_t>(v)]);
    kept[r] = escapes[r] = 1;
  }

  // 3. Storages: graph inputs, then escaping classes; internal classes are
  // temporaries of the task that allocates them.
  std::vector<int32_t> storage_of(num_values, -1);
  std::vector<char> is_input(num_values, 0);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ir::Input& in = g.inputs()[i];
    auto v = static_cast<size_t>(in.value);
    is_input[v] = 1;
    TaskGraph::Storage s;
    s.input_index = static_cast<int32_t>(i);
    s.kept = true;
    s.persistent_input = in.role == ir::InputRole::Input;
    s.bytes = s.persistent_input ? f.dense_bytes[v] : 0;
    s.output = kept[v] != 0;
    storage_of[v] = static_cast<int32_t>(t.storages.size());
    t.storages.push_back(s);
  }
  for (size_t v = 0; v < num_values; ++v) {
    if (is_input[v] || root[v] != static_cast<ir::ValueId>(v) || producer[v] < 0) continue;
    // A root allocates, unless it is the fresh output of an alias op with no base.
    int64_t bytes = f.dense_bytes[v];
    if (!escapes[v]) {
      t.temp_bytes[static_cast<size_t>(producer[v])] += bytes;
      continue;
    }
    TaskGraph::Storage s;
    s.producer = producer[v];
    s.bytes = bytes;
    s.kept = s.output = kept[v] != 0;
    storage_of[v] = static_cast<int32_t>(t.storages.size());
    t.storages.push_back(s);
  }
  size_t num_storages = t.storages.size();
  std::vector<Pair> storage_tensors, releases, allocs;
  for (size_t x = 0; x < t.tensors.size(); ++x) {
    TaskGraph::Tensor& ten = t.tensors[x];
    ten.storage = storage_of[static_cast<size_t>(root[static_cast<size_t>(ten.value)])];
    MP_INTERNAL_ASSERT(ten.storage >= 0, "tensor %{} has no storage", g.value(ten.value).name);
    if (ten.producer < 0) ten.input_index = t.storages[static_cast<size_t>(ten.storage)].input_index;
    storage_tensors.emplace_back(ten.storage, static_cast<int32_t>(x));
  }
  t.storage_readers.assign(num_storages, 0);
  for (size_t v = 0; v < num_values; ++v) {
    int32_t s = storage_of[v];
    if (s < 0) continue;
    const TaskGraph::Storage& st = t.storages[static_cast<size_t>(s)];
    t.storage_readers[static_cast<size_t>(s)] = reader_begin[v + 1] - reader_begin[v];
    if (st.producer >= 0) {
      allocs.emplace_back(st.producer, s);
      t.out_bytes[static_cast<size_t>(st.producer)] += st.bytes;
    }
    if (st.kept) continue;
    for (int32_t k = reader_begin[v]; k < reader_begin[v + 1]; ++k) {
      releases.emplace_back(reader_tasks[static_cast<size_t>(k)], s);
    }
  }
  pairsToCsr(storage_tensors, num_storages, t.storage_tensor_begin, t.storage_tensors);
  pairsToCsr(releases, num_tasks, t.release_begin, t.releases);
  pairsToCsr(allocs, num_tasks, t.alloc_begin, t.allocs);

  // 4. Edges: data (with bytes) and in-place ordering (0 bytes).
  std::vector<std::pair<Pair, int64_t>> edges;  // ((from, to), bytes)
  for (size_t task = 0; task < num_tasks; ++task) {
    for (int32_t x : t.inputsOf(static_cast<int32_t>(task))) {
      const TaskGraph::Tensor& ten = t.tensors[static_cast<size_t>(x)];
      if (ten.producer >= 0) edges.push_back({{ten.producer, static_cast<int32_t>(task)}, ten.bytes});
    }
  }
  for (auto [m, n] : inPlaceOrderEdges(f)) {
    int32_t a = task_of(m), b = task_of(n);
    if (a != b) edges.push_back({{a, b}, 0});
  }
  std::sort(edges.begin(), edges.end());
  std::vector<Pair> succ_pairs, pred_pairs;
  for (size_t k = 0; k < edges.size();) {
    Pair e = edges[k].first;
    int64_t bytes = 0;
    for (; k < edges.size() && edges[k].first == e; ++k) bytes += edges[k].second;
    succ_pairs.push_back(e);
    t.succ_bytes.push_back(bytes);  // edges are sorted by (from, to): CSR order
    pred_pairs.emplace_back(e.second, e.first);
  }
  pairsToCsr(succ_pairs, num_tasks, t.succ_begin, t.succs);
  pairsToCsr(pred_pairs, num_tasks, t.pred_begin, t.preds);

  // 5. Kahn's order (BFS, ties by task id = first node in graph order).
  std::vector<int32_t> indeg(num_tasks);
  std::deque<int32_t> queue;
  for (size_t u = 0; u < num_tasks; ++u) {
    indeg[u] = t.pred_begin[u + 1] - t.pred_begin[u];
    if (indeg[u] == 0) queue.push_back(static_cast<int32_t>(u));
  }
  t.rank.assign(num_tasks, -1);
  t.topo.reserve(num_tasks);
  while (!queue.empty()) {
    int32_t u = queue.front();
    queue.pop_front();
    t.rank[static_cast<size_t>(u)] = static_cast<int32_t>(t.topo.size());
    t.topo.push_back(u);
    for (int32_t v : t.succsOf(u)) {
      if (--indeg[static_cast<size_t>(v)] == 0) queue.push_back(v);
    }
  }
  if (t.topo.size() != num_tasks) {
    for (size_t u = 0; u < num_tasks; ++u) {
      if (t.rank[u] >= 0) continue;
      MP_THROW(ConfigError,
               "modelpar place: the grouping of graph @{} has a cycle through unit {} (node {}); "
               "units must form a DAG", g.name(), u, g.nodeRef(t.membersOf(static_cast<int32_t>(u))[0]));
    }
  }

  // 6. Groups: names, persistent bytes, tasks.
  auto num_groups = static_cast<size_t>(c->num_groups);
  t.group_name.assign(num_groups, "");
  t.group_persistent.assign(num_groups, 0);
  std::vector<Pair> group_tasks;
  for (size_t u = 0; u < num_tasks; ++u) {
    auto grp = static_cast<size_t>(t.group[u]);
    MP_CHECK(grp < num_groups, ConfigError, "modelpar place: unit {} is in group {} of {}", u,
             grp, num_groups);
    group_tasks.emplace_back(static_cast<int32_t>(grp), static_cast<int32_t>(u));
    t.group_persistent[grp] += t.persistent_bytes[u];
  }
  pairsToCsr(group_tasks, num_groups, t.group_task_begin, t.group_tasks);
  std::vector<int32_t> first_node(num_groups, std::numeric_limits<int32_t>::max());
  for (size_t n = 0; n < num_nodes; ++n) {
    auto grp = static_cast<size_t>(t.group[static_cast<size_t>(c->unit_of_node[n])]);
    const std::string& layer = g.nodes()[n].layer;
    if (t.group_name[grp].empty() && !layer.empty()) t.group_name[grp] = layer;
    first_node[grp] = std::min(first_node[grp], static_cast<int32_t>(n));
  }
  for (size_t grp = 0; grp < num_groups; ++grp) {
    if (t.group_name[grp].empty() && first_node[grp] != std::numeric_limits<int32_t>::max()) {
      t.group_name[grp] = g.nodeRef(first_node[grp]);
    }
  }
  return t;
}

}  // namespace modelpar::passes
