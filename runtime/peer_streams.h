// PeerStreams: a device's streams by peer (its tx streams, and a CUDA
// device's rx streams), the part of Device::tx() and Device::connectTo() the
// CPU worker and the CUDA device share: the lookup that names a missing
// connectTo, the same-kind check, and idempotent creation. Internal to
// runtime/ (cpu_device.cpp, cuda_device.cpp).
#pragma once

#include <map>
#include <memory>
#include <utility>

#include "runtime/check.h"
#include "runtime/device.h"

namespace modelpar::runtime {

/// One stream of kind S per peer device index, owned. `kind` and
/// `preposition` name the streams in messages: `"tx", "to"` or `"rx", "from"`.
template <class S>
class PeerStreams {
 public:
  PeerStreams(const char* kind, const char* preposition) : kind_(kind), preposition_(preposition) {}

  /// The stream for `peer`. InternalError naming `owner` when
  /// connectTo() did not create it.
  S& at(const Device& owner, int peer) const {
    auto it = streams_.find(peer);
    MP_RT_INTERNAL_ASSERT(it != streams_.end(), owner.describe(), " has no ", kind_, " stream ",
                          preposition_, " device ", peer, " (connectTo was not called)");
    return *it->second;
  }
  /// The stream for `peer`, made by `make()` unless it exists. `make` runs
  /// before anything is inserted, so a stream that fails to start (a CPU
  /// stream's thread) leaves no entry.
  template <class Make>
  S& connect(int peer, Make&& make) {
    auto it = streams_.find(peer);
    if (it == streams_.end()) it = streams_.emplace(peer, std::forward<Make>(make)()).first;
    return *it->second;
  }
  bool empty() const { return streams_.empty(); }
  auto begin() { return streams_.begin(); }
  auto end() { return streams_.end(); }

 private:
  const char* kind_;
  const char* preposition_;
  std::map<int, std::unique_ptr<S>> streams_;
};

/// The precondition of Device::connectTo(): `peer` is of `self`'s kind (an
/// executor's devices all come from one DeviceMap).
inline void checkSameKind(const Device& self, const Device& peer) {
  MP_RT_INTERNAL_ASSERT(peer.kind() == self.kind(), "connecting ", self.describe(), " to ",
                        peer.describe(), ", a device of another kind");
}

}  // namespace modelpar::runtime
