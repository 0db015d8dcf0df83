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

#include <limits>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "runtime/interpreter.h"
#include "tests/support/expect_error.h"

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

// The message of the ExecutionError that `op(a[, b])` raises in a graph.
std::string errorOf(const std::string& op, const std::string& type_a, IValue a,
                    const std::string& type_b = "", IValue b = IValue()) {
  const bool binary = !type_b.empty();
  const std::string g = "graph @e(%a: " + type_a + " input" +
                        (binary ? ", %b: " + type_b + " input" : "") + ") {\n  %r: " +
                        (op == "sym_float" ? "float" : "int") + " = modelpar::" + op + "(%a" +
                        (binary ? ", %b" : "") + ")\n  return %r\n}";
  std::vector<IValue> in{std::move(a)};
  if (binary) in.push_back(std::move(b));
  return modelpar::testing::messageOf<modelpar::ExecutionError>([&] { run(g, std::move(in)); });
}

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Note [Checked size arithmetic]: Python's ints do not overflow, ours are int64.
TEST(SymOps, IntegerOverflowIsAnExecutionErrorNamingTheOperands) {
  struct Case { const char* op; int64_t a, b; const char* says; };
  for (const Case& c : {Case{"sym_add", kMax, 1, "9223372036854775807 + 1 does not fit in int64"},
                        Case{"sym_sub", kMin, 1, "- 1 does not fit in int64"},
                        Case{"sym_mul", int64_t{1} << 32, int64_t{1} << 31, "does not fit in int64"},
                        Case{"sym_floordiv", kMin, -1, "-9223372036854775808 // -1 does not fit"},
                        Case{"sym_pow", 3, 40, "3 ** 40 does not fit in int64"},
                        Case{"sym_pow", -2, 64, "-2 ** 64 does not fit in int64"}}) {
    const std::string m = errorOf(c.op, "int", IValue(c.a), "int", IValue(c.b));
    EXPECT_HAS(m, std::string("modelpar::") + c.op + ": integer overflow");
    EXPECT_HAS(m, c.says);
    EXPECT_HAS(m, "node %r");
  }
  EXPECT_HAS(errorOf("sym_neg", "int", IValue(kMin)), "sym_neg: integer overflow");
}

TEST(SymOps, ResultsAtTheEdgesOfInt64AreExact) {
  std::vector<IValue> out = run(R"(
    graph @edges(%min: int input, %max: int input) {
      %m: int = modelpar::sym_mod(%min, -1)
      %q: int = modelpar::sym_floordiv(%min, 1)
      %p: int = modelpar::sym_pow(-2, 63)
      %s: int = modelpar::sym_add(%max, %min)
      %t: int = modelpar::sym_pow(2, 62)
      return %m, %q, %p, %s, %t
    })", {IValue(kMin), IValue(kMax)});
  EXPECT_EQ(out[0].toInt(), 0);  // Python: -2**63 % -1 == 0
  EXPECT_EQ(out[1].toInt(), kMin);
  EXPECT_EQ(out[2].toInt(), kMin);  // (-2)**63 fits exactly
  EXPECT_EQ(out[3].toInt(), -1);
  EXPECT_EQ(out[4].toInt(), int64_t{1} << 62);
}

TEST(SymOps, DivisionAndModuloByZeroSayWhichOperation) {
  EXPECT_HAS(errorOf("sym_floordiv", "int", IValue(int64_t{7}), "int", IValue(int64_t{0})),
             "sym_floordiv: integer division by zero (7 // 0)");
  EXPECT_HAS(errorOf("sym_mod", "int", IValue(int64_t{7}), "int", IValue(int64_t{0})),
             "sym_mod: integer modulo by zero (7 % 0)");
  EXPECT_HAS(errorOf("sym_floordiv", "float", IValue(1.5), "float", IValue(0.0)),
             "sym_floordiv: float division by zero");
  EXPECT_HAS(errorOf("sym_mod", "float", IValue(1.5), "int", IValue(int64_t{0})),
             "sym_mod: float modulo by zero");
  EXPECT_HAS(errorOf("sym_pow", "int", IValue(int64_t{0}), "int", IValue(int64_t{-1})),
             "0 cannot be raised to a negative power");
}

TEST(SymOps, TrueDivisionByZeroIsAnExecutionError) {
  const std::string g = R"(
    graph @t(%a: int input, %b: int input) {
      %r: float = modelpar::sym_truediv(%a, %b)
      return %r
    })";
  const std::string m = modelpar::testing::messageOf<modelpar::ExecutionError>(
      [&] { run(g, {IValue(int64_t{3}), IValue(int64_t{0})}); });
  EXPECT_HAS(m, "sym_truediv: division by zero (3 / 0)");
}

TEST(SymOps, NanInfAndHugeFloatsConvertedToIntAreExecutionErrors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* op : {"sym_int", "sym_ceil", "sym_floor"}) {
    EXPECT_HAS(errorOf(op, "float", IValue(nan)), "cannot convert float nan to integer");
    EXPECT_HAS(errorOf(op, "float", IValue(inf)), "cannot convert float inf to integer");
    EXPECT_HAS(errorOf(op, "float", IValue(-inf)), "cannot convert float -inf to integer");
    EXPECT_HAS(errorOf(op, "float", IValue(1e19)), "does not fit in int64");
    EXPECT_HAS(errorOf(op, "float", IValue(-1e19)), "does not fit in int64");
  }
  // -2**63 is the one float at the edge that fits.
  std::vector<IValue> out = run(R"(
    graph @ok(%f: float input) {
      %i: int = modelpar::sym_floor(%f)
      return %i
    })", {IValue(-9223372036854775808.0)});
  EXPECT_EQ(out[0].toInt(), kMin);
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
