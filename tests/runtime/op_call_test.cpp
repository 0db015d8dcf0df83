// ResolvedOp, the operator call of every runtime: Note [Factory ops follow
// their device] (a device passed to call() replaces the graph's Device /
// Device? arguments), tested with the meta device as the CPU twin of a GPU.
#include "runtime/op_call.h"

#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>

#include "ir/parser.h"

namespace modelpar::runtime {
namespace {

ir::Graph factories() {
  return ir::parseGraph(R"(
    graph @g() {
      %z: f32[4] = aten::zeros([4], device=device("cpu"))
      %r: i64[3] = aten::arange(3)
      return %z, %r
    })");
}

TEST(OpCall, DeviceArgumentsAreKeptWithoutAPlace) {
  const ir::Graph g = factories();
  for (ir::NodeId n = 0; n < 2; ++n) {
    const std::vector<c10::IValue> out = ResolvedOp(g, n).call(Env(g.numValues()));
    EXPECT_EQ(out.at(0).toTensor().device(), c10::Device(c10::kCPU)) << n;
  }
}

TEST(OpCall, APlaceReplacesGivenAndDefaultDevices) {
  const ir::Graph g = factories();
  const c10::Device meta(c10::kMeta);
  // device=cpu given (zeros) and device=None by default (arange) both follow.
  for (ir::NodeId n = 0; n < 2; ++n) {
    const std::vector<c10::IValue> out = ResolvedOp(g, n).call(Env(g.numValues()), &meta);
    EXPECT_EQ(out.at(0).toTensor().device(), meta) << n;
  }
}

}  // namespace
}  // namespace modelpar::runtime
