// analyzeLiveness: one forward pass per device over flat per-value arrays
// that are reset through a touched list, so the whole program costs
// O(instructions + values).
#include "passes/lower/liveness.h"

#include <algorithm>

namespace modelpar::passes {
namespace {

// Orders releases by (after, value) in O(n): counting sort on `after`
// (-1 .. n-1), then the rare ties by value.
void sortByPosition(std::vector<ValueRelease>& r, size_t n, std::vector<int32_t>& bucket) {
  bucket.assign(n + 2, 0);
  for (const ValueRelease& x : r) ++bucket[static_cast<size_t>(x.after + 1) + 1];
  for (size_t i = 1; i < bucket.size(); ++i) bucket[i] += bucket[i - 1];
  std::vector<ValueRelease> out(r.size());
  for (const ValueRelease& x : r) out[static_cast<size_t>(bucket[static_cast<size_t>(x.after + 1)]++)] = x;
  for (size_t i = 0; i < out.size();) {
    size_t j = i + 1;
    while (j < out.size() && out[j].after == out[i].after) ++j;
    if (j - i > 1) {
      std::sort(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(j),
                [](const ValueRelease& a, const ValueRelease& b) { return a.value < b.value; });
    }
    i = j;
  }
  r = std::move(out);
}

}  // namespace

std::vector<DeviceLiveness> analyzeLiveness(const ir::Program& p) {
  return analyzeLiveness(p, flatten(p.graph()));
}

std::vector<DeviceLiveness> analyzeLiveness(const ir::Program& p, const FlatGraph& f) {
  const ir::Graph& g = p.graph();
  size_t nv = g.numValues();
  const std::vector<ir::ValueId>& base = f.alias_base;
  std::vector<char> is_output(nv, 0);
  for (ir::ValueId v : g.outputs()) is_output[static_cast<size_t>(v)] = 1;
  std::vector<int32_t> input_device(nv, -1);
  std::vector<char> input_role(nv, 0);  // 1 input, 2 param / buffer
  for (const ir::Input& in : g.inputs()) {
    input_device[static_cast<size_t>(in.value)] = in.device.value_or(0);
    input_role[static_cast<size_t>(in.value)] = in.role == ir::InputRole::Input ? 1 : 2;
  }
  // Where each value is produced (home), to tell kept outputs.
  std::vector<int32_t> home(input_device);
  for (int d = 0; d < p.numDevices(); ++d) {
    for (const ir::Instruction& inst : p.schedule(d)) {
      if (inst.kind != ir::Instruction::Kind::Run) continue;
      auto n = static_cast<size_t>(inst.node);
      for (int32_t k = f.out_begin[n]; k < f.out_begin[n + 1]; ++k) {
        home[static_cast<size_t>(f.outs[static_cast<size_t>(k)])] = d;
      }
    }
  }

  constexpr int32_t kUnset = -2;
  std::vector<int32_t> defined(nv, kUnset), last_use(nv, kUnset), freed(nv, kUnset);
  std::vector<int32_t> class_last(nv, kUnset);
  std::vector<ir::ValueId> root(nv, ir::kNoId);
  std::vector<char> kept(nv, 0);
  std::vector<int64_t> bytes(nv, 0);
  std::vector<ir::ValueId> touched;
  std::vector<int32_t> bucket;
  std::vector<DeviceLiveness> out(static_cast<size_t>(p.numDevices()));

  for (int d = 0; d < p.numDevices(); ++d) {
    DeviceLiveness& L = out[static_cast<size_t>(d)];
    const auto& sched = p.schedule(d);
    L.alloc_bytes.assign(sched.size(), 0);
    L.temp_bytes.assign(sched.size(), 0);
    auto define = [&](ir::ValueId v, int32_t at, ir::ValueId r, int64_t b) {
      auto vi = static_cast<size_t>(v);
      if (defined[vi] == kUnset) touched.push_back(v);
      defined[vi] = at;
      root[vi] = r;
      bytes[vi] = b;
    };
    for (const ir::Input& in : g.inputs()) {
      if (input_device[static_cast<size_t>(in.value)] != d) continue;
      int64_t b = input_role[static_cast<size_t>(in.value)] == 1 ? f.dense_bytes[static_cast<size_t>(in.value)] : 0;
      define(in.value, -1, in.value, b);
    }
    // 1. Definitions and last uses.
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& inst = sched[i];
      auto at = static_cast<int32_t>(i);
      switch (inst.kind) {
        case ir::Instruction::Kind::Run: {
          auto n = static_cast<size_t>(inst.node);
          for (int32_t k = f.arg_begin[n]; k < f.arg_begin[n + 1]; ++k) {
            auto v = static_cast<size_t>(f.args[static_cast<size_t>(k)]);
            if (defined[v] != kUnset) last_use[v] = at;
          }
          bool alias = f.aliases[n] != 0;
          for (int32_t k = f.out_begin[n]; k < f.out_begin[n + 1]; ++k) {
            ir::ValueId o = f.outs[static_cast<size_t>(k)];
            ir::ValueId b = base[static_cast<size_t>(o)];
            // An alias whose base is not here (or has none) is a fresh tensor.
            bool shares = alias && b != ir::kNoId && defined[static_cast<size_t>(b)] != kUnset;
            int64_t ob = shares ? 0 : f.dense_bytes[static_cast<size_t>(o)];
            define(o, at, shares ? root[static_cast<size_t>(b)] : o, ob);
            L.alloc_bytes[i] += ob;
          }
          L.temp_bytes[i] = f.temp_bytes[n];
          L.persistent_bytes += f.persistent_bytes[n];
          break;
        }
        case ir::Instruction::Kind::Send:
          if (defined[static_cast<size_t>(inst.value)] != kUnset) {
            last_use[static_cast<size_t>(inst.value)] = at;
          }
          break;
        case ir::Instruction::Kind::Recv: {
          int64_t b = f.dense_bytes[static_cast<size_t>(inst.value)];
          define(inst.value, at, inst.value, b);
          L.alloc_bytes[i] += b;
          break;
        }
        case ir::Instruction::Kind::Free:
          if (defined[static_cast<size_t>(inst.value)] != kUnset) {
            freed[static_cast<size_t>(inst.value)] = at;
          }
          break;
      }
    }
    // 2. Per storage class: last use, kept.
    for (ir::ValueId v : touched) {
      auto vi = static_cast<size_t>(v);
      auto r = static_cast<size_t>(root[vi]);
      int32_t end = std::max(defined[vi], last_use[vi]);
      class_last[r] = std::max(class_last[r], end);
      if ((is_output[vi] && home[vi] == d) || (input_role[vi] == 2 && input_device[vi] == d)) {
        kept[r] = 1;
      }
    }
    // 3. Releases.
    for (ir::ValueId v : touched) {
      auto vi = static_cast<size_t>(v);
      if (root[vi] != v) {
        if (is_output[vi] && home[vi] == d) continue;  // a returned view stays
        L.alias_ends.push_back({std::max(defined[vi], last_use[vi]), v, 0});
        continue;
      }
      int32_t at = class_last[vi];
      if (freed[vi] != kUnset) at = std::max(at, freed[vi]);
      else if (kept[vi]) continue;
      if (at < 0) {
        continue;  // an input nothing here uses: never allocated
      }
      L.releases.push_back({at, v, bytes[vi]});
    }
    for (ir::ValueId v : touched) {
      auto vi = static_cast<size_t>(v);
      if (defined[vi] == -1 && root[vi] == v) {
        bool used = class_last[vi] >= 0 || kept[vi] || freed[vi] != kUnset;
        if (used) L.start_bytes += bytes[vi];
      }
    }
    sortByPosition(L.releases, sched.size(), bucket);
    sortByPosition(L.alias_ends, sched.size(), bucket);
    // Reset the per-value state for the next device.
    for (ir::ValueId v : touched) {
      auto vi = static_cast<size_t>(v);
      defined[vi] = last_use[vi] = freed[vi] = class_last[vi] = kUnset;
      root[vi] = ir::kNoId;
      kept[vi] = 0;
      bytes[vi] = 0;
    }
    touched.clear();
  }
  return out;
}

}  // namespace modelpar::passes
