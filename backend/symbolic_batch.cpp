// A captured step with a symbolic batch dimension (symbolic_batch.h).
#include "backend/symbolic_batch.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "ir/printer.h"
#include "runtime/check.h"

namespace modelpar::backend {
namespace {

std::string typeText(const ir::Type& t) { return ir::toString(t); }

/// Graph inputs that a forward node reads (optimizer state, such as SGD's
/// momentum buffers, is read only by the update).
std::vector<char> readInForward(const ir::Graph& g) {
  std::vector<char> read(g.numValues(), 0);
  for (const ir::Node& n : g.nodes()) {
    if (n.phase != ir::Phase::Forward && n.phase.has_value()) continue;
    for (ir::ValueId v : n.inputs()) read[static_cast<size_t>(v)] = 1;
  }
  return read;
}

/// A data input: role input, a tensor with a static leading dimension, read
/// by a forward node.
bool isDataInput(const ir::Graph& g, const ir::Input& in, const std::vector<char>& forward) {
  const ir::Value& v = g.value(in.value);
  return in.role == ir::InputRole::Input && v.type.isTensor() && !v.type.shape.empty() &&
         v.type.shape[0].isStatic() && forward[static_cast<size_t>(in.value)];
}

std::string inputList(const ir::Graph& g, const std::vector<char>& forward) {
  std::string out;
  for (const ir::Input& in : g.inputs()) {
    if (!isDataInput(g, in, forward)) continue;
    const ir::Value& v = g.value(in.value);
    out += c10::str(out.empty() ? "" : ", ", "%", v.name, ": ", typeText(v.type));
  }
  return out.empty() ? "none" : out;
}

/// Replaces ints equal to `b` in `a` (and its list items) by `%size`.
bool replaceSizes(ir::Arg& a, int64_t b, ir::ValueId size) {
  if (a.kind() == ir::Arg::Kind::Int && a.toInt() == b) {
    std::string keyword = a.keyword();
    a = ir::Arg::value(size);
    if (!keyword.empty()) a.withKeyword(std::move(keyword));
    return true;
  }
  bool any = false;
  if (a.isList()) {
    for (ir::Arg& item : a.items()) any = replaceSizes(item, b, size) || any;
  }
  return any;
}

/// 1. The inputs named by `names` (each a data input) and B.
void findNamedBatchedInputs(const ir::Graph& g, const std::vector<std::string>& names,
                            const std::vector<char>& forward, SymbolicBatch& out,
                            std::vector<char>& batched) {
  for (const std::string& name : names) {
    const ir::Input* found = nullptr;
    for (const ir::Input& in : g.inputs()) {
      if (g.value(in.value).name == name) found = &in;
    }
    MP_RT_CHECK(found && isDataInput(g, *found, forward), ConfigError,
                "modelpar pipeline: batched_inputs names '", name, "', which is not a data input "
                "of the captured step (an input read in the forward, with a leading dimension); its data "
                "inputs: ", inputList(g, forward));
    const int64_t b = g.value(found->value).type.shape[0].size;
    MP_RT_CHECK(out.batch_size == 0 || out.batch_size == b, ConfigError,
                "modelpar pipeline: the batched inputs disagree on the batch size: %",
                out.batched_inputs.front(), " has ", out.batch_size, ", %", name, " has ", b);
    out.batch_size = b;
    out.batched_inputs.push_back(name);
    batched[static_cast<size_t>(found->value)] = 1;
  }
}

/// 1. Without names: B is the one leading size of the data inputs, and the
/// batched inputs are the data inputs that have it.
void guessBatchedInputs(const ir::Graph& g, const std::vector<char>& forward, SymbolicBatch& out,
                        std::vector<char>& batched) {
  std::set<int64_t> leading;
  for (const ir::Input& in : g.inputs()) {
    if (isDataInput(g, in, forward)) leading.insert(g.value(in.value).type.shape[0].size);
  }
  MP_RT_CHECK(!leading.empty(), ConfigError,
              "modelpar pipeline: the captured step has no data input with a leading (batch) "
              "dimension read in the forward to split into micro-batches");
  MP_RT_CHECK(leading.size() == 1, ConfigError,
              "modelpar pipeline: cannot tell the batch dimension: the step's data inputs have "
              "different leading sizes (", inputList(g, forward), "); say which inputs are batched with "
              "the pipeline option batched_inputs (names as in the graph, e.g. set by "
              "modelpar::nameTensor)");
  out.batch_size = *leading.begin();
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    if (isDataInput(g, in, forward) && v.type.shape[0].size == out.batch_size) {
      out.batched_inputs.push_back(v.name);
      batched[static_cast<size_t>(in.value)] = 1;
    }
  }
}

/// 2. B must not be any other size in sight.
void checkBatchSizeIsUnique(const ir::Graph& g, const std::vector<char>& batched, int64_t b) {
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    if (batched[static_cast<size_t>(in.value)] || !v.type.isTensor()) continue;
    for (const ir::Dim& d : v.type.shape) {
      MP_RT_CHECK(!(d.isStatic() && d.size == b), ConfigError, "modelpar pipeline: the batch size ",
                  b, " is also a dimension of %", v.name, ": ", typeText(v.type),
                  ", so the device cannot tell which sizes are the batch; use a batch size that no ",
                  "parameter, buffer or unbatched input has as a dimension");
    }
  }
}

/// 3. Batched values: computed (outside the update) from batched ones.
void markBatchedValues(const ir::Graph& g, std::vector<char>& batched) {
  for (const ir::Node& n : g.nodes()) {
    if (n.phase == ir::Phase::Update) continue;
    bool reads = false;
    for (ir::ValueId v : n.inputs()) reads = reads || batched[static_cast<size_t>(v)];
    if (reads) {
      for (ir::ValueId o : n.outputs) batched[static_cast<size_t>(o)] = 1;
    }
  }
}

/// 4. Every value's type in the new graph: B in the batched types.
std::vector<ir::Type> symbolicTypes(const ir::Graph& g, const std::vector<char>& batched,
                                    int64_t b) {
  std::vector<ir::Type> types(g.numValues());
  for (size_t v = 0; v < g.numValues(); ++v) {
    types[v] = g.values()[v].type;
    if (!batched[v] || !types[v].isTensor()) continue;
    if (g.values()[v].producer == ir::kNoId) {  // a batched input: dimension 0
      types[v].shape[0] = ir::Dim::symbolic(kBatchSymbol);
      continue;
    }
    int hits = 0;
    for (ir::Dim& d : types[v].shape) {
      if (!(d.isStatic() && d.size == b)) continue;
      d = ir::Dim::symbolic(kBatchSymbol);
      ++hits;
    }
    MP_RT_CHECK(hits <= 1, ConfigError, "modelpar pipeline: %", g.values()[v].name, ": ",
                typeText(g.values()[v].type), " has the batch size ", b, " in ", hits,
                " dimensions, so the device cannot tell which is the batch; use another batch size");
    MP_RT_CHECK(static_cast<int64_t>(types[v].shape.size()) < b, ConfigError,
                "modelpar pipeline: the batch size ", b, " is not larger than the rank of %",
                g.values()[v].name, ": ", typeText(g.values()[v].type), ", so a dimension argument ",
                "could be taken for it; use a batch size larger than ", types[v].shape.size());
  }
  return types;
}

/// 4. The new graph's inputs and nodes: `types`, and %B in size arguments;
/// returns where each value of g went.
std::vector<ir::ValueId> buildSymbolicGraph(const ir::Graph& g, const std::vector<char>& batched,
                                            const std::vector<ir::Type>& types, int64_t b,
                                            SymbolicBatch& out) {
  ir::Graph& s = out.graph;
  s.setName(g.name());
  std::vector<ir::ValueId> remap(g.numValues(), ir::kNoId);
  for (const ir::Input& in : g.inputs()) {
    const ir::Value& v = g.value(in.value);
    remap[static_cast<size_t>(in.value)] = s.addInput(v.name, types[static_cast<size_t>(in.value)], in.role, in.device);
  }
  std::unordered_set<std::string> taken;
  for (const ir::Value& v : g.values()) taken.insert(v.name);
  MP_RT_CHECK(!taken.count(kBatchSymbol), ConfigError, "modelpar pipeline: the step already has a "
              "value named %", kBatchSymbol, ", the name of the batch size input");
  const ir::ValueId size = s.addInput(kBatchSymbol, ir::Type::scalar(ir::Type::Kind::Int), ir::InputRole::Input);
  for (const ir::Node& n : g.nodes()) {
    std::vector<ir::Arg> args = n.args;
    bool reads = false;
    for (ir::ValueId v : n.inputs()) reads = reads || batched[static_cast<size_t>(v)];
    for (ir::Arg& a : args) {
      a.remapValues([&](ir::ValueId v) { return remap[static_cast<size_t>(v)]; });
      if (reads && !a.isValue()) out.has_size_input = replaceSizes(a, b, size) || out.has_size_input;
    }
    std::vector<std::pair<std::string, ir::Type>> outs;
    for (ir::ValueId o : n.outputs) outs.emplace_back(g.value(o).name, types[static_cast<size_t>(o)]);
    const ir::NodeId id = s.addNode(n.qualifiedName(), std::move(args), std::move(outs));
    ir::Node& m = s.node(id);
    for (size_t k = 0; k < n.outputs.size(); ++k) remap[static_cast<size_t>(n.outputs[k])] = m.outputs[k];
    m.layer = n.layer;
    m.phase = n.phase;
    m.device = n.device;
    m.microbatch = n.microbatch;
    m.random = n.random;
    m.cost = n.cost;
    if (!n.label.empty()) s.setLabel(id, n.label);
  }
  return remap;
}

/// 5. The backward seed: `loss.backward()` makes ones_like(loss) before the
///    autograd engine starts, so it was recorded in the forward.
void markBackwardSeeds(SymbolicBatch& out) {
  ir::Graph& s = out.graph;
  for (size_t id = 0; id < s.numNodes(); ++id) {
    ir::Node& m = s.node(static_cast<ir::NodeId>(id));
    if (m.qualifiedName() != "aten::ones_like" || m.outputs.size() != 1) continue;
    if (!s.value(m.outputs[0]).type.isTensor() || !s.value(m.outputs[0]).type.shape.empty()) continue;
    bool only_backward = true, any = false;
    for (const ir::Node& r : s.nodes()) {
      for (ir::ValueId v : r.inputs()) {
        if (v != m.outputs[0]) continue;
        any = true;
        only_backward = only_backward && r.phase == ir::Phase::Backward;
      }
    }
    if (any && only_backward && m.phase != ir::Phase::Backward) {
      m.phase = ir::Phase::Backward;
      ++out.seed_nodes;
    }
  }
}

}  // namespace

SymbolicBatch makeBatchSymbolic(const ir::Graph& g, const std::vector<std::string>& names) {
  SymbolicBatch out;
  const std::vector<char> forward = readInForward(g);
  // 1. The batched inputs and B (data inputs: see isDataInput).
  std::vector<char> batched(g.numValues(), 0);
  if (!names.empty()) {
    findNamedBatchedInputs(g, names, forward, out, batched);
  } else {
    guessBatchedInputs(g, forward, out, batched);
  }
  const int64_t b = out.batch_size;
  checkBatchSizeIsUnique(g, batched, b);  // 2.
  markBatchedValues(g, batched);          // 3.
  // 4. The new graph: B in the batched types, %B in size arguments.
  const std::vector<ir::Type> types = symbolicTypes(g, batched, b);
  const std::vector<ir::ValueId> remap = buildSymbolicGraph(g, batched, types, b, out);
  markBackwardSeeds(out);  // 5.
  std::vector<ir::ValueId> outputs;
  for (ir::ValueId o : g.outputs()) outputs.push_back(remap[static_cast<size_t>(o)]);
  out.graph.setOutputs(std::move(outputs));
  return out;
}

}  // namespace modelpar::backend
