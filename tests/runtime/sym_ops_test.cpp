// modelpar::sym_* (runtime/sym_ops.h): size arithmetic with Python semantics,
// resolved and called by the Interpreter like ATen operators; and numbers
// passed where a schema wants a Tensor (ResolvedOp's wrapped numbers), which
// graphs captured by torch.compile rely on.
#include "runtime/sym_ops.h"

#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>

#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "runtime/interpreter.h"

namespace modelpar::runtime {
namespace {

using c10::IValue;

std::vector<IValue> run(const std::string& text, std::vector<IValue> inputs) {
  registerSymOps();
  Interpreter interp(ir::parseGraph(text));
  return interp.run(std::move(inputs));
}

// Python: -7 // 2 == -4, -7 % 2 == 1, 7 // -2 == -4, 7 % -2 == -1.
TEST(SymOps, FloorDivisionAndModuloRoundTowardMinusInfinity) {
  const std::string g = R"(
    graph @sizes(%a: int input, %b: int input) {
      %q: int = modelpar::sym_floordiv(%a, %b)
      %r: int = modelpar::sym_mod(%a, %b)
      return %q, %r
    })";
  struct Case { int64_t a, b, q, r; };
  for (const Case& c : {Case{-7, 2, -4, 1}, Case{7, -2, -4, -1}, Case{7, 2, 3, 1}, Case{-6, 3, -2, 0}}) {
    std::vector<IValue> out = run(g, {c.a, c.b});
    EXPECT_EQ(out[0].toInt(), c.q) << c.a << " // " << c.b;
    EXPECT_EQ(out[1].toInt(), c.r) << c.a << " % " << c.b;
  }
}

TEST(SymOps, IntOpIntStaysIntAndMixedGivesFloat) {
  std::vector<IValue> out = run(R"(
    graph @mixed(%a: int input, %f: float input) {
      %m: int = modelpar::sym_mul(%a, 16)
      %x: float = modelpar::sym_mul(%a, %f)
      %t: float = modelpar::sym_truediv(%a, 4)
      %c: int = modelpar::sym_ceil(%t)
      %lt: bool = modelpar::sym_lt(%a, %f)
      return %m, %x, %t, %c, %lt
    })", {IValue(int64_t{6}), IValue(2.5)});
  EXPECT_EQ(out[0].toInt(), 96);
  EXPECT_DOUBLE_EQ(out[1].toDouble(), 15.0);
  EXPECT_DOUBLE_EQ(out[2].toDouble(), 1.5);
  EXPECT_EQ(out[3].toInt(), 2);
  EXPECT_FALSE(out[4].toBool());
}

TEST(SymOps, DivisionByZeroIsAnExecutionError) {
  const std::string g = R"(
    graph @z(%a: int input) {
      %q: int = modelpar::sym_floordiv(%a, 0)
      return %q
    })";
  EXPECT_THROW(run(g, {IValue(int64_t{1})}), modelpar::ExecutionError);
}

TEST(SymOps, SizesFeedAtenShapeArguments) {
  at::Tensor x = at::randn({3, 4});
  std::vector<IValue> out = run(R"(
    graph @view(%x: f32[B, 4] input, %b: int input) {
      %n: int = modelpar::sym_mul(%b, 4)
      %v: f32[e_4xB] = aten::view(%x, [%n])
      return %v
    })", {x, IValue(int64_t{3})});
  EXPECT_EQ(out[0].toTensor().sizes(), (std::vector<int64_t>{12}));
}

// The Python argument parser turns `x + 1` into add.Tensor(x, <wrapped 1>);
// a wrapped number does not promote the tensor's dtype within its category.
TEST(WrappedNumbers, NumbersForTensorParametersPromoteLikePythonScalars) {
  at::Tensor h = at::randn({3}).to(at::kHalf);
  at::Tensor i = at::arange(3);
  std::vector<IValue> out = run(R"(
    graph @w(%h: f16[3] input, %i: i64[3] input, %n: int input) {
      %a: f16[3] = aten::add.Tensor(%h, 0.5)
      %b: f32[3] = aten::mul.Tensor(%i, 2.5)
      %c: i64[3] = aten::add.Tensor(%i, %n)
      return %a, %b, %c
    })", {h, i, IValue(int64_t{4})});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::add(h, 0.5)));
  EXPECT_TRUE(at::equal(out[1].toTensor(), at::mul(i, 2.5)));
  EXPECT_TRUE(at::equal(out[2].toTensor(), at::add(i, 4)));
}

}  // namespace
}  // namespace modelpar::runtime
