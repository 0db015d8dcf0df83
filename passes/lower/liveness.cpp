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

constexpr int32_t kUnset = -2;

// The per-value state of one device's scan, in flat arrays reset through
// the touched list between devices; one method per step.
class LivenessScan {
 public:
  LivenessScan(const ir::Program& p, const FlatGraph& f)
      : p_(p), g_(p.graph()), f_(f), nv_(g_.numValues()), is_output_(nv_, 0),
        input_device_(nv_, -1), input_role_(nv_, 0), defined_(nv_, kUnset), last_use_(nv_, kUnset),
        freed_(nv_, kUnset), class_last_(nv_, kUnset), root_(nv_, ir::kNoId), kept_(nv_, 0),
        bytes_(nv_, 0), read_here_(nv_, 0) {
    for (ir::ValueId v : g_.outputs()) is_output_[static_cast<size_t>(v)] = 1;
    for (const ir::Input& in : g_.inputs()) {
      input_device_[static_cast<size_t>(in.value)] = in.device.value_or(0);
      input_role_[static_cast<size_t>(in.value)] = in.role == ir::InputRole::Input ? 1 : 2;
    }
    findHomes();
  }

  DeviceLiveness scan(int d) {
    DeviceLiveness L;
    const auto& sched = p_.schedule(d);
    L.alloc_bytes.assign(sched.size(), 0);
    L.temp_bytes.assign(sched.size(), 0);
    defineInputs(d);
    findDefinitionsAndLastUses(sched, L);
    findClassLastUses(d);
    addReleases(d, L);
    addStartBytes(L);
    sortByPosition(L.releases, sched.size(), bucket_);
    sortByPosition(L.alias_ends, sched.size(), bucket_);
    reset();
    return L;
  }

 private:
  // Where each value is produced (home), to tell kept outputs.
  void findHomes() {
    home_ = input_device_;
    for (int d = 0; d < p_.numDevices(); ++d) {
      for (const ir::Instruction& inst : p_.schedule(d)) {
        if (inst.kind != ir::Instruction::Kind::Run) continue;
        auto n = static_cast<size_t>(inst.node);
        for (int32_t k = f_.out_begin[n]; k < f_.out_begin[n + 1]; ++k) {
          home_[static_cast<size_t>(f_.outs[static_cast<size_t>(k)])] = d;
        }
      }
    }
  }
  void define(ir::ValueId v, int32_t at, ir::ValueId r, int64_t b) {
    auto vi = static_cast<size_t>(v);
    if (defined_[vi] == kUnset) touched_.push_back(v);
    defined_[vi] = at;
    root_[vi] = r;
    bytes_[vi] = b;
  }
  // The device's graph inputs, defined before its first instruction. A
  // parameter or buffer counts through its readers' persistent bytes, or
  // its own bytes where no node of this device reads it (Note [Memory
  // model]: held here only to be sent, as a training rank holds a
  // parameter an inference graph reads elsewhere).
  void defineInputs(int d) {
    for (const ir::Instruction& inst : p_.schedule(d)) {
      if (inst.kind != ir::Instruction::Kind::Run) continue;
      auto n = static_cast<size_t>(inst.node);
      for (int32_t k = f_.arg_begin[n]; k < f_.arg_begin[n + 1]; ++k) {
        auto v = static_cast<size_t>(f_.args[static_cast<size_t>(k)]);
        if (input_device_[v] == d && !read_here_[v]) {
          read_here_[v] = 1;
          read_list_.push_back(static_cast<ir::ValueId>(v));
        }
      }
    }
    for (const ir::Input& in : g_.inputs()) {
      auto v = static_cast<size_t>(in.value);
      if (input_device_[v] != d) continue;
      const bool counted = input_role_[v] == 1 || !read_here_[v];
      define(in.value, -1, in.value, counted ? f_.dense_bytes[v] : 0);
    }
    for (ir::ValueId v : read_list_) read_here_[static_cast<size_t>(v)] = 0;
    read_list_.clear();
  }

  // 1. Definitions and last uses.
  void findDefinitionsAndLastUses(const std::vector<ir::Instruction>& sched, DeviceLiveness& L) {
    const std::vector<ir::ValueId>& base = f_.alias_base;
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& inst = sched[i];
      auto at = static_cast<int32_t>(i);
      switch (inst.kind) {
        case ir::Instruction::Kind::Run: {
          auto n = static_cast<size_t>(inst.node);
          for (int32_t k = f_.arg_begin[n]; k < f_.arg_begin[n + 1]; ++k) {
            auto v = static_cast<size_t>(f_.args[static_cast<size_t>(k)]);
            if (defined_[v] != kUnset) last_use_[v] = at;
          }
          bool alias = f_.aliases[n] != 0;
          for (int32_t k = f_.out_begin[n]; k < f_.out_begin[n + 1]; ++k) {
            ir::ValueId o = f_.outs[static_cast<size_t>(k)];
            ir::ValueId b = base[static_cast<size_t>(o)];
            // An alias whose base is not here (or has none) is a fresh tensor.
            bool shares = alias && b != ir::kNoId && defined_[static_cast<size_t>(b)] != kUnset;
            int64_t ob = shares ? 0 : f_.storage_bytes[static_cast<size_t>(o)];
            define(o, at, shares ? root_[static_cast<size_t>(b)] : o, ob);
            L.alloc_bytes[i] += ob;
          }
          L.temp_bytes[i] = f_.temp_bytes[n];
          L.persistent_bytes += f_.persistent_bytes[n];
          break;
        }
        case ir::Instruction::Kind::Send:
          if (defined_[static_cast<size_t>(inst.value)] != kUnset) {
            last_use_[static_cast<size_t>(inst.value)] = at;
          }
          break;
        case ir::Instruction::Kind::Recv: {
          int64_t b = f_.dense_bytes[static_cast<size_t>(inst.value)];
          define(inst.value, at, inst.value, b);
          L.alloc_bytes[i] += b;
          break;
        }
        case ir::Instruction::Kind::Free:
          if (defined_[static_cast<size_t>(inst.value)] != kUnset) {
            freed_[static_cast<size_t>(inst.value)] = at;
          }
          break;
      }
    }
  }

  // 2. Per storage class: last use, kept.
  void findClassLastUses(int d) {
    for (ir::ValueId v : touched_) {
      auto vi = static_cast<size_t>(v);
      auto r = static_cast<size_t>(root_[vi]);
      int32_t end = std::max(defined_[vi], last_use_[vi]);
      class_last_[r] = std::max(class_last_[r], end);
      if ((is_output_[vi] && home_[vi] == d) || (input_role_[vi] == 2 && input_device_[vi] == d)) {
        kept_[r] = 1;
      }
    }
  }

  // 3. Releases.
  void addReleases(int d, DeviceLiveness& L) {
    for (ir::ValueId v : touched_) {
      auto vi = static_cast<size_t>(v);
      if (root_[vi] != v) {
        if (is_output_[vi] && home_[vi] == d) continue;  // a returned view stays
        L.alias_ends.push_back({std::max(defined_[vi], last_use_[vi]), v, 0});
        continue;
      }
      int32_t at = class_last_[vi];
      if (freed_[vi] != kUnset) at = std::max(at, freed_[vi]);
      else if (kept_[vi]) continue;
      if (at < 0) {
        continue;  // an input nothing here uses: never allocated
      }
      L.releases.push_back({at, v, bytes_[vi]});
    }
  }

  // The inputs held at the start: those used, kept or freed here.
  void addStartBytes(DeviceLiveness& L) const {
    for (ir::ValueId v : touched_) {
      auto vi = static_cast<size_t>(v);
      if (defined_[vi] == -1 && root_[vi] == v) {
        bool used = class_last_[vi] >= 0 || kept_[vi] || freed_[vi] != kUnset;
        if (used) L.start_bytes += bytes_[vi];
      }
    }
  }

  // Reset the per-value state for the next device.
  void reset() {
    for (ir::ValueId v : touched_) {
      auto vi = static_cast<size_t>(v);
      defined_[vi] = last_use_[vi] = freed_[vi] = class_last_[vi] = kUnset;
      root_[vi] = ir::kNoId;
      kept_[vi] = 0;
      bytes_[vi] = 0;
    }
    touched_.clear();
  }

  const ir::Program& p_;
  const ir::Graph& g_;
  const FlatGraph& f_;
  const size_t nv_;
  std::vector<char> is_output_;
  std::vector<int32_t> input_device_;
  std::vector<char> input_role_;  // 1 input, 2 param / buffer
  std::vector<int32_t> home_;
  std::vector<int32_t> defined_, last_use_, freed_, class_last_;
  std::vector<ir::ValueId> root_;
  std::vector<char> kept_;
  std::vector<int64_t> bytes_;
  std::vector<char> read_here_;  // defineInputs: inputs a node of the device reads
  std::vector<ir::ValueId> read_list_;
  std::vector<ir::ValueId> touched_;
  std::vector<int32_t> bucket_;
};

}  // namespace

std::vector<DeviceLiveness> analyzeLiveness(const ir::Program& p) {
  return analyzeLiveness(p, flatten(p.graph()));
}

std::vector<DeviceLiveness> analyzeLiveness(const ir::Program& p, const FlatGraph& f) {
  LivenessScan scan(p, f);
  std::vector<DeviceLiveness> out;
  out.reserve(static_cast<size_t>(p.numDevices()));
  for (int d = 0; d < p.numDevices(); ++d) out.push_back(scan.scan(d));
  return out;
}

}  // namespace modelpar::passes
