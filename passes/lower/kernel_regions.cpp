// Kernel regions: see kernel_regions.h.
#include "passes/lower/kernel_regions.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "ir/check.h"
#include "ir/node_copy.h"
#include "ir/verifier.h"

namespace modelpar::passes {

namespace {

using ir::Instruction;
using ir::NodeId;
using ir::ValueId;
using Kind = Instruction::Kind;

// A run under construction: its nodes and the frees that stood among them.
struct Run {
  int device = 0;
  size_t first = 0;  // index of its first instruction in the device's list
  size_t end = 0;    // one past its last `run`
  std::vector<NodeId> nodes;
  std::vector<size_t> frees;  // instruction indices

  bool empty() const { return nodes.empty(); }
};

bool sameStep(const ir::Node& a, const ir::Node& b) {
  return a.phase == b.phase && a.microbatch == b.microbatch;
}

class RegionFinder {
 public:
  RegionFinder(const ir::Program& p, const std::vector<bool>& fusible, size_t min_nodes)
      : p_(p), g_(p.graph()), fusible_(fusible), min_nodes_(std::max<size_t>(min_nodes, 1)) {}

  std::vector<Run> find() {
    std::vector<Run> out;
    for (int d = 0; d < p_.numDevices(); ++d) {
      const std::vector<Instruction>& list = p_.schedule(d);
      Run cur{d, 0, 0, {}, {}};
      auto close = [&]() {
        if (cur.nodes.size() >= min_nodes_) out.push_back(cur);
        cur = Run{d, 0, 0, {}, {}};
      };
      for (size_t i = 0; i < list.size(); ++i) {
        const Instruction& inst = list[i];
        if (inst.kind == Kind::Free) {
          if (!cur.empty()) cur.frees.push_back(i);
          continue;
        }
        bool joins = inst.kind == Kind::Run && fusible_[static_cast<size_t>(inst.node)] &&
                     !g_.node(inst.node).outputs.empty();
        if (joins && !cur.empty() && !sameStep(g_.node(cur.nodes.front()), g_.node(inst.node))) {
          close();
        }
        if (!joins) {
          close();
          continue;
        }
        if (cur.empty()) cur.first = i;
        cur.nodes.push_back(inst.node);
        cur.end = i + 1;
      }
      close();
    }
    return out;
  }

 private:
  const ir::Program& p_;
  const ir::Graph& g_;
  const std::vector<bool>& fusible_;
  size_t min_nodes_;
};

// The frees recorded inside a run that come after its last `run` are not
// part of it: they stay where they are.
void trimFrees(Run& r) {
  r.frees.erase(std::remove_if(r.frees.begin(), r.frees.end(), [&](size_t i) { return i >= r.end; }),
                r.frees.end());
}

std::string commonLayer(const ir::Graph& g, const std::vector<NodeId>& nodes) {
  const std::string& first = g.node(nodes.front()).layer;
  for (NodeId n : nodes) {
    if (g.node(n).layer != first) return "";
  }
  return first;
}

// region_of[n]: the run node n belongs to, or -1.
std::vector<int> regionOfNodes(const ir::Graph& g, const std::vector<Run>& runs) {
  std::vector<int> region_of(g.numNodes(), -1);
  for (size_t r = 0; r < runs.size(); ++r) {
    for (NodeId n : runs[r].nodes) region_of[static_cast<size_t>(n)] = static_cast<int>(r);
  }
  return region_of;
}

// needed_outside[v]: v is read by a node of another item (see orderItems),
// sent, or returned.
std::vector<bool> neededOutside(const ir::Program& p, const std::vector<int>& region_of) {
  const ir::Graph& g = p.graph();
  std::vector<bool> needed_outside(g.numValues(), false);
  for (size_t n = 0; n < g.numNodes(); ++n) {
    for (ValueId v : g.node(static_cast<NodeId>(n)).inputs()) {
      const ir::Value& val = g.value(v);
      if (val.producer == ir::kNoId || region_of[static_cast<size_t>(val.producer)] != region_of[n] ||
          region_of[n] == -1) {
        needed_outside[static_cast<size_t>(v)] = true;
      }
    }
  }
  for (ValueId v : g.outputs()) needed_outside[static_cast<size_t>(v)] = true;
  for (int d = 0; d < p.numDevices(); ++d) {
    for (const Instruction& inst : p.schedule(d)) {
      if (inst.kind == Kind::Send) needed_outside[static_cast<size_t>(inst.value)] = true;
    }
  }
  return needed_outside;
}

// The runs as regions, with what each region reads and writes.
struct Contraction {
  std::vector<int> region_of;         // see regionOfNodes
  std::vector<KernelRegion> regions;  // one per run
  std::vector<bool> internal;         // produced in a region and needed nowhere outside it
};

// Inputs, outputs and internal values of region r, whose key, device and
// nodes are set.
void describeRegion(const ir::Graph& g, size_t r, const std::vector<bool>& needed_outside,
                    Contraction& c) {
  KernelRegion& k = c.regions[r];
  std::vector<bool> seen(g.numValues(), false);
  for (NodeId n : k.nodes) {
    for (ValueId v : g.node(n).inputs()) {
      const ir::Value& val = g.value(v);
      bool inside = val.producer != ir::kNoId &&
                    c.region_of[static_cast<size_t>(val.producer)] == static_cast<int>(r);
      if (!inside && !seen[static_cast<size_t>(v)]) {
        seen[static_cast<size_t>(v)] = true;
        k.inputs.push_back(v);
      }
    }
    for (ValueId v : g.node(n).outputs) {
      if (needed_outside[static_cast<size_t>(v)]) {
        k.outputs.push_back(v);
      } else {
        c.internal[static_cast<size_t>(v)] = true;
      }
    }
  }
  // Tensors first, then sizes (the operator's two lists).
  for (ValueId v : k.inputs) {
    const ir::Type& t = g.value(v).type;
    MP_CHECK(t.isTensor() || t.kind == ir::Type::Kind::Int, InvalidIrError,
             "modelpar kernel-regions: graph @{}: region {} on device {} reads %{} of type {}; "
             "a region reads tensors and ints only (the fusible mask admitted its reader)",
             g.name(), k.key, k.device, g.value(v).name, ir::toString(t));
  }
  std::stable_partition(k.inputs.begin(), k.inputs.end(),
                        [&](ValueId v) { return g.value(v).type.isTensor(); });
  k.num_tensor_inputs = static_cast<size_t>(std::count_if(
      k.inputs.begin(), k.inputs.end(), [&](ValueId v) { return g.value(v).type.isTensor(); }));
}

// Inputs, outputs and internal values of each region.
Contraction contract(const ir::Program& p, const std::vector<Run>& runs,
                     const KernelRegionOptions& options) {
  const ir::Graph& g = p.graph();
  Contraction c;
  c.region_of = regionOfNodes(g, runs);
  c.regions.resize(runs.size());
  std::vector<bool> needed_outside = neededOutside(p, c.region_of);
  c.internal.assign(g.numValues(), false);
  for (size_t r = 0; r < runs.size(); ++r) {
    KernelRegion& k = c.regions[r];
    k.key = options.first_key + static_cast<int>(r);
    k.device = runs[r].device;
    k.nodes = runs[r].nodes;
    describeRegion(g, r, needed_outside, c);
  }
  return c;
}

// Items: an unfused node (its id) or a region (-(r + 1)); order them
// topologically, ties by the smallest original node id.
std::vector<int> orderItems(const ir::Graph& g, const Contraction& c) {
  const std::vector<int>& region_of = c.region_of;
  const std::vector<KernelRegion>& regions = c.regions;
  auto itemOf = [&](NodeId n) -> int {
    int r = region_of[static_cast<size_t>(n)];
    return r == -1 ? n : -(r + 1);
  };
  auto itemKey = [&](int item) -> NodeId {
    return item >= 0 ? item : regions[static_cast<size_t>(-item - 1)].nodes.front();
  };
  std::vector<int> items;
  for (size_t n = 0; n < g.numNodes(); ++n) {
    int r = region_of[n];
    if (r == -1 || regions[static_cast<size_t>(r)].nodes.front() == static_cast<NodeId>(n)) {
      items.push_back(itemOf(static_cast<NodeId>(n)));
    }
  }
  auto slot = [&](int item) -> size_t {
    return item >= 0 ? static_cast<size_t>(item) : g.numNodes() + static_cast<size_t>(-item - 1);
  };
  std::vector<std::vector<int>> succ(g.numNodes() + regions.size());
  std::vector<int> indegree(g.numNodes() + regions.size(), 0);
  for (int item : items) {
    std::vector<NodeId> members = item >= 0 ? std::vector<NodeId>{item}
                                            : regions[static_cast<size_t>(-item - 1)].nodes;
    std::vector<int> preds;
    for (NodeId n : members) {
      for (ValueId v : g.node(n).inputs()) {
        NodeId prod = g.value(v).producer;
        if (prod == ir::kNoId) continue;
        int pi = itemOf(prod);
        if (pi != item) preds.push_back(pi);
      }
    }
    std::sort(preds.begin(), preds.end());
    preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
    for (int pi : preds) {
      succ[slot(pi)].push_back(item);
      ++indegree[slot(item)];
    }
  }
  auto later = [&](int a, int b) { return itemKey(a) > itemKey(b); };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (int item : items) {
    if (indegree[slot(item)] == 0) ready.push(item);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    int item = ready.top();
    ready.pop();
    order.push_back(item);
    for (int s : succ[slot(item)]) {
      if (--indegree[slot(s)] == 0) ready.push(s);
    }
  }
  MP_INTERNAL_ASSERT(order.size() == items.size(),
                     "kernel-regions: graph @{}: contracting the regions made a cycle", g.name());
  return order;
}

// The new graph, with where each old value and unfused node went.
struct Rebuilt {
  ir::Graph graph;
  std::vector<ValueId> value_map;
  std::vector<NodeId> node_map;
};

// Adds region k's node to `out` (args, outputs, layer, step, cost) and maps
// its outputs; sets k.node.
void addRegionNode(const ir::Graph& g, KernelRegion& k, const KernelRegionOptions& options,
                   const std::function<ValueId(ValueId)>& mapped, ir::Graph& out,
                   std::vector<ValueId>& value_map) {
  std::vector<ir::Arg> tensors;
  std::vector<ir::Arg> sizes;
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    (i < k.num_tensor_inputs ? tensors : sizes).push_back(ir::Arg::value(k.inputs[i]));
  }
  std::vector<ir::Arg> args{ir::Arg::integer(k.key), ir::Arg::list(std::move(tensors)),
                            ir::Arg::list(std::move(sizes))};
  std::vector<std::pair<std::string, ir::Type>> outs;
  for (ValueId v : k.outputs) outs.emplace_back(g.value(v).name, g.value(v).type);
  for (ir::Arg& a : args) a.remapValues(mapped);
  NodeId m = out.addNode(options.op, std::move(args), std::move(outs));
  ir::Node& node = out.node(m);
  const ir::Node& first = g.node(k.nodes.front());
  node.layer = commonLayer(g, k.nodes);
  node.phase = first.phase;
  node.device = first.device;
  node.microbatch = first.microbatch;
  bool costed = false;
  ir::Cost cost;
  for (NodeId n : k.nodes) {
    if (!g.node(n).cost) continue;
    costed = true;
    cost.time_us += g.node(n).cost->time_us;
    cost.temp_bytes = std::max(cost.temp_bytes, g.node(n).cost->temp_bytes);
  }
  for (ValueId v : k.outputs) cost.output_bytes += g.value(v).type.bytes().value_or(0);
  if (costed) node.cost = cost;
  if (node.outputs.empty()) out.setLabel(m, "region" + std::to_string(k.key));
  for (size_t i = 0; i < k.outputs.size(); ++i) {
    value_map[static_cast<size_t>(k.outputs[i])] = node.outputs[i];
  }
  k.node = m;
}

// The new graph: the items in `order`, each region as one node.
Rebuilt buildGraph(const ir::Graph& g, const std::vector<int>& order,
                   std::vector<KernelRegion>& regions, const KernelRegionOptions& options) {
  Rebuilt b{ir::Graph(g.name()), std::vector<ValueId>(g.numValues(), ir::kNoId),
            std::vector<NodeId>(g.numNodes(), ir::kNoId)};
  ir::Graph& out = b.graph;
  std::vector<ValueId>& value_map = b.value_map;
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    value_map[static_cast<size_t>(in.value)] = out.addInput(v.name, v.type, in.role, in.device);
  }
  auto mapped = [&](ValueId v) {
    ValueId m = value_map[static_cast<size_t>(v)];
    MP_INTERNAL_ASSERT(m != ir::kNoId, "kernel-regions: value {} read before it is defined",
                       g.value(v).name);
    return m;
  };
  for (int item : order) {
    if (item >= 0) {
      NodeId m = ir::copyNode(g, item, out, {.value = mapped}, &value_map);
      b.node_map[static_cast<size_t>(item)] = m;
      continue;
    }
    addRegionNode(g, regions[static_cast<size_t>(-item - 1)], options, mapped, out, value_map);
  }
  std::vector<ValueId> outputs;
  for (ValueId v : g.outputs()) outputs.push_back(value_map[static_cast<size_t>(v)]);
  out.setOutputs(std::move(outputs));
  return b;
}

// Device d's new schedule: each run replaced by its region's node and the
// frees that stood in it, frees of internal values dropped.
void rescheduleDevice(const ir::Program& p, int d, const std::vector<Run>& runs,
                      const Contraction& c, const Rebuilt& b, ir::Program& result) {
  const std::vector<Instruction>& list = p.schedule(d);
  std::vector<int> region_starting(list.size(), -1);
  std::vector<bool> skipped(list.size(), false);
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].device != d) continue;
    region_starting[runs[r].first] = static_cast<int>(r);
    for (size_t i = runs[r].first; i < runs[r].end; ++i) skipped[i] = true;
  }
  for (size_t i = 0; i < list.size(); ++i) {
    int r = region_starting[i];
    if (r != -1) {
      result.append(d, Instruction::run(c.regions[static_cast<size_t>(r)].node));
      for (size_t f : runs[static_cast<size_t>(r)].frees) {
        ValueId v = list[f].value;
        if (!c.internal[static_cast<size_t>(v)]) {
          result.append(d, Instruction::free(b.value_map[static_cast<size_t>(v)]));
        }
      }
    }
    if (skipped[i]) continue;
    Instruction inst = list[i];
    if (inst.kind == Kind::Free && c.internal[static_cast<size_t>(inst.value)]) continue;
    if (inst.kind == Kind::Run) {
      inst.node = b.node_map[static_cast<size_t>(inst.node)];
    } else {
      inst.value = b.value_map[static_cast<size_t>(inst.value)];
    }
    result.append(d, inst);
  }
}

}  // namespace

ir::Program oneDeviceProgram(const ir::Graph& g) {
  ir::Program p(g, 1);
  for (size_t n = 0; n < g.numNodes(); ++n) p.append(0, Instruction::run(static_cast<NodeId>(n)));
  return p;
}

KernelRegions fuseKernelRegions(const ir::Program& p, const std::vector<bool>& fusible,
                                const KernelRegionOptions& options) {
  const ir::Graph& g = p.graph();
  MP_CHECK(fusible.size() == g.numNodes(), InvalidIrError,
           "modelpar kernel-regions: graph @{} has {} nodes but the fusible mask has {} entries",
           g.name(), g.numNodes(), fusible.size());
  std::vector<Run> runs = RegionFinder(p, fusible, options.min_nodes).find();
  if (runs.empty()) return KernelRegions{p, {}};
  for (Run& r : runs) trimFrees(r);

  Contraction c = contract(p, runs, options);
  std::vector<int> order = orderItems(g, c);
  Rebuilt b = buildGraph(g, order, c.regions, options);

  // The new schedules.
  ir::Program result(std::move(b.graph), p.numDevices());
  for (int d = 0; d < p.numDevices(); ++d) rescheduleDevice(p, d, runs, c, b, result);
  ir::verify(result);
  return KernelRegions{std::move(result), std::move(c.regions)};
}

}  // namespace modelpar::passes
