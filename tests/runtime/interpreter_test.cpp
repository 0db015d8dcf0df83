// Interpreter (and the ResolvedOp binding under it): results equal direct ATen
// calls; every error path raises the right modelpar error type naming the
// node, operator and argument or input.
#include "runtime/interpreter.h"

#include <gtest/gtest.h>

#include "tests/support/expect_error.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/index.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>

#include <string>

#include "ir/error.h"
#include "ir/parser.h"

namespace modelpar::runtime {
namespace {

using c10::IValue;

at::Tensor randn(std::vector<int64_t> sizes) { return at::randn(sizes); }

std::vector<IValue> run(const std::string& text, std::vector<IValue> inputs) {
  Interpreter interp(ir::parseGraph(text));
  return interp.run(std::move(inputs));
}

using modelpar::testing::messageOf;

// ---- results equal eager ATen -------------------------------------------------

//   %x   %w
//    |    t
//    +-- mm --> %y
TEST(Interpreter, RunsTransposeAndMatmulLikeEager) {
  at::Tensor x = randn({4, 8}), w = randn({3, 8});
  auto out = run(R"(
    graph @lin(%x: f32[4, 8] input, %w: f32[3, 8] param) {
      %wt: f32[8, 3] = aten::t(%w)
      %y: f32[4, 3] = aten::mm(%x, %wt)
      return %y
    })", {x, w});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::mm(x, w.t())));
}

TEST(Interpreter, BindsKeywordsAndFillsSchemaDefaults) {
  at::Tensor a = randn({2, 5}), b = randn({2, 5});
  auto out = run(R"(
    graph @g(%a: f32[2, 5] input, %b: f32[2, 5] input) {
      %s: f32[2, 5] = aten::add.Tensor(%a, %b, alpha=2)
      %r: f32[2, 1] = aten::sum.dim_IntList(%s, [1], keepdim=true)
      %q: f32[2] = aten::sum.dim_IntList(%s, [1])
      return %r, %q
    })", {a, b});
  at::Tensor s = at::add(a, b, 2);
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::sum(s, {1}, true)));
  EXPECT_TRUE(at::allclose(out[1].toTensor(), at::sum(s, {1}, false)));
}

TEST(Interpreter, ConvertsDtypeLayoutAndDeviceConstants) {
  auto out = run(R"(
    graph @g() {
      %z: i64[2, 3] = aten::zeros(size=[2, 3], dtype=dtype.i64, layout=layout.strided, device=device("cpu"))
      %f: f64[2, 3] = aten::_to_copy(%z, dtype=dtype.f64, memory_format=memory_format.contiguous_format)
      return %z, %f
    })", {});
  EXPECT_EQ(out[0].toTensor().scalar_type(), at::kLong);
  EXPECT_EQ(out[1].toTensor().scalar_type(), at::kDouble);
  EXPECT_EQ(out[1].toTensor().sum().item().toDouble(), 0.0);
}

// split returns Tensor[]: one IR output per element; cat takes Tensor[].
TEST(Interpreter, SpreadsTensorListResultOverOutputsAndPassesTensorLists) {
  at::Tensor x = randn({4, 3});
  auto out = run(R"(
    graph @g(%x: f32[4, 3] input) {
      %a: f32[2, 3], %b: f32[2, 3] = aten::split.Tensor(%x, 2)
      %c: f32[2, 6] = aten::cat([%b, %a], 1)
      return %a, %c
    })", {x});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::equal(out[0].toTensor(), x.slice(0, 0, 2)));
  EXPECT_TRUE(at::equal(out[1].toTensor(), at::cat({x.slice(0, 2, 4), x.slice(0, 0, 2)}, 1)));
}

TEST(Interpreter, PassesOptionalTensorListWithNone) {
  at::Tensor x = randn({3, 4});
  at::Tensor idx = at::tensor({2, 0}, at::kLong);
  auto out = run(R"(
    graph @g(%x: f32[3, 4] input, %i: i64[2] input) {
      %y: f32[3, 2] = aten::index.Tensor(%x, [None, %i])
      return %y
    })", {x, idx});
  c10::List<std::optional<at::Tensor>> indices;
  indices.push_back(std::nullopt);
  indices.push_back(idx);
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::index(x, indices)));
}

// _foreach ops take Scalar[] and return Tensor[] (optimizer updates use them).
TEST(Interpreter, PassesScalarListsToForeachOps) {
  at::Tensor x = randn({2}), y = randn({3});
  auto out = run(R"(
    graph @g(%x: f32[2] input, %y: f32[3] input) {
      %a: f32[2], %b: f32[3] = aten::_foreach_add.ScalarList([%x, %y], [1, 2.5])
      return %a, %b
    })", {x, y});
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::add(x, 1)));
  EXPECT_TRUE(at::allclose(out[1].toTensor(), at::add(y, 2.5)));
}

// `int[2] kernel_size` given as `2` means [2, 2], as in TorchScript.
TEST(Interpreter, ExpandsSingleIntForFixedSizeIntList) {
  at::Tensor x = randn({1, 2, 4, 4});
  auto out = run(R"(
    graph @g(%x: f32[1, 2, 4, 4] input) {
      %y: f32[1, 2, 2, 2] = aten::max_pool2d(%x, 2)
      return %y
    })", {x});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::max_pool2d(x, {2, 2})));
}

// %n is an int value computed at run time and used inside an int list.
TEST(Interpreter, FeedsIntValuesIntoSizeListsWithSymbolicBatch) {
  at::Tensor x = randn({5, 6});
  auto out = run(R"(
    graph @g(%x: f32[B, 6] input) {
      %n: int = aten::sym_size.int(%x, 0)
      %y: f32[B, 2, 3] = aten::view(%x, [%n, 2, 3])
      return %y, %n
    })", {x});
  EXPECT_TRUE(at::equal(out[0].toTensor(), x.view({5, 2, 3})));
  EXPECT_EQ(out[1].toInt(), 5);
}

TEST(Interpreter, TakesScalarInputsAndReturnsScalarResults) {
  at::Tensor x = randn({3});
  auto out = run(R"(
    graph @g(%x: f32[3] input, %s: float input) {
      %y: f32[3] = aten::mul.Scalar(%x, %s)
      %t: f32[] = aten::sum(%y)
      %v: float = aten::_local_scalar_dense(%t)
      return %y, %v
    })", {x, IValue(2)});  // an int for a float input is converted
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::mul(x, 2)));
  EXPECT_NEAR(out[1].toDouble(), at::mul(x, 2).sum().item().toDouble(), 1e-5);
}

TEST(Interpreter, InPlaceOpReturnsTheTensorItMutated) {
  at::Tensor x = randn({4});
  at::Tensor expected = at::relu(x);
  auto out = run(R"(
    graph @g(%x: f32[4] input) {
      %r: f32[4] = aten::relu_(%x)
      return %r
    })", {x});
  EXPECT_TRUE(out[0].toTensor().is_same(x));
  EXPECT_TRUE(at::equal(x, expected));
}

TEST(Interpreter, ViewSharesStorageWithItsBase) {
  at::Tensor x = randn({2, 6});
  auto out = run(R"(
    graph @g(%x: f32[2, 6] input) {
      %v: f32[3, 4] = aten::view(%x, [3, 4])
      %p: f32[4, 3] = aten::permute(%v, [1, 0])
      return %p
    })", {x});
  EXPECT_EQ(out[0].toTensor().data_ptr(), x.data_ptr());
  EXPECT_TRUE(at::equal(out[0].toTensor(), x.view({3, 4}).permute({1, 0})));
}

//   %x -> relu %a -> neg %b --+
//          %a ----------------+-> add %c (returned)
//   %x -> neg %d (unused)
TEST(Interpreter, DropsEachValueAfterItsLastReader) {
  Interpreter interp(ir::parseGraph(R"(
    graph @g(%x: f32[4] input) {
      %a: f32[4] = aten::relu(%x)
      %b: f32[4] = aten::neg(%a)
      %d: f32[4] = aten::neg(%x)
      %c: f32[4] = aten::add.Tensor(%a, %b)
      return %c
    })"));
  const ir::Graph& g = interp.graph();
  auto id = [&](const char* name) { return *g.findValue(name); };
  using Ids = std::vector<ir::ValueId>;
  ASSERT_EQ(interp.dropsAfter().size(), 4u);
  EXPECT_EQ(interp.dropsAfter()[0], Ids{});
  EXPECT_EQ(interp.dropsAfter()[1], Ids{});
  EXPECT_EQ(interp.dropsAfter()[2], (Ids{id("x"), id("d")}));
  EXPECT_EQ(interp.dropsAfter()[3], (Ids{id("a"), id("b")}));
  at::Tensor x = randn({4});
  EXPECT_TRUE(at::allclose(interp.run({x})[0].toTensor(), at::sub(at::relu(x), at::relu(x))));
}

// ---- errors at resolution -----------------------------------------------------

TEST(InterpreterErrors, UnknownOperatorNamesNodeAndOperator) {
  std::string msg = messageOf<UnsupportedOpError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[4] input) {
        %y: f32[4] = aten::frobnicate(%x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "node %y");
  EXPECT_HAS(msg, "unknown operator aten::frobnicate");
}

TEST(InterpreterErrors, UnknownOverloadListsTheExistingOnes) {
  std::string msg = messageOf<UnsupportedOpError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[4] input) {
        %y: f32[4] = aten::add.Nope(%x, %x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "unknown operator aten::add.Nope");
  EXPECT_HAS(msg, "Tensor");
}

TEST(InterpreterErrors, TooManyPositionalArgumentsSaysHowManyFit) {
  std::string msg = messageOf<InvalidIrError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[4] input) {
        %y: f32[4] = aten::relu(%x, %x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "node %y (aten::relu)");
  EXPECT_HAS(msg, "2 positional arguments given");
  EXPECT_HAS(msg, "at most 1");
}

TEST(InterpreterErrors, UnknownKeywordListsValidNames) {
  std::string msg = messageOf<InvalidIrError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[2, 3] input) {
        %y: f32[2, 1] = aten::sum.dim_IntList(%x, [1], keep=true)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "node %y (aten::sum.dim_IntList)");
  EXPECT_HAS(msg, "unknown keyword argument 'keep'");
  EXPECT_HAS(msg, "self, dim, keepdim, dtype");
}

TEST(InterpreterErrors, MissingArgumentIsNamed) {
  std::string msg = messageOf<InvalidIrError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[2, 2] input) {
        %y: f32[2, 2] = aten::mm(%x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "node %y (aten::mm)");
  EXPECT_HAS(msg, "missing argument 'mat2' (Tensor)");
}

TEST(InterpreterErrors, ArgumentGivenTwiceIsNamed) {
  std::string msg = messageOf<InvalidIrError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[2] input) {
        %y: f32[2] = aten::add.Tensor(%x, %x, other=%x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "argument 'other' given twice");
}

TEST(InterpreterErrors, ListWhereTensorExpectedNamesArgumentAndSchemaType) {
  std::string msg = messageOf<InvalidIrError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[2, 2] input) {
        %y: f32[2, 2] = aten::mm([%x], %x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "node %y (aten::mm)");
  EXPECT_HAS(msg, "argument 'self' expects Tensor, got [%x]");
}

TEST(InterpreterErrors, TensorWhereIntListExpectedShowsTheValueType) {
  std::string msg = messageOf<InvalidIrError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[2, 3] input) {
        %y: f32[2, 3] = aten::view(%x, %x)
        return %y
      })"));
  });
  EXPECT_HAS(msg, "argument 'size' expects SymInt[], got %x (f32[2, 3])");
}

TEST(InterpreterErrors, SchemaTypeWithoutIrFormIsUnsupported) {
  std::string msg = messageOf<UnsupportedOpError>([] {
    Interpreter(ir::parseGraph(R"(
      graph @g(%x: f32[2, 3] input) {
        ^rec = aten::record_stream(%x, 0)
        return %x
      })"));
  });
  EXPECT_HAS(msg, "node ^rec (aten::record_stream): argument 's' has schema type Stream, "
                  "which modelpar cannot pass");
}

// ---- errors at run time -------------------------------------------------------

constexpr const char* kMm = R"(
  graph @mm(%x: f32[4, 8] input, %w: f32[8, 2] param) {
    %y: f32[4, 2] = aten::mm(%x, %w)
    return %y
  })";

TEST(InterpreterErrors, WrongInputShapeNamesInputAndBothTypes) {
  Interpreter interp(ir::parseGraph(kMm));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({4, 9}), randn({8, 2})}); });
  EXPECT_HAS(msg, "graph @mm input 0 (%x): expected f32[4, 8], got f32[4, 9]");
}

TEST(InterpreterErrors, WrongInputDtypeNamesBothTypes) {
  Interpreter interp(ir::parseGraph(kMm));
  std::string msg = messageOf<ExecutionError>(
      [&] { interp.run({randn({4, 8}), randn({8, 2}).to(at::kDouble)}); });
  EXPECT_HAS(msg, "input 1 (%w): expected f32[8, 2], got f64[8, 2]");
}

TEST(InterpreterErrors, WrongInputCountListsTheInputs) {
  Interpreter interp(ir::parseGraph(kMm));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({4, 8})}); });
  EXPECT_HAS(msg, "graph @mm takes 2 inputs (%x, %w), got 1");
}

TEST(InterpreterErrors, SymbolicSizeMustAgreeAcrossInputs) {
  Interpreter interp(ir::parseGraph(R"(
    graph @g(%x: f32[B, 2] input, %b: f32[B] input) {
      %y: f32[B] = aten::sum.dim_IntList(%x, [1])
      %z: f32[B] = aten::add.Tensor(%y, %b)
      return %z
    })"));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({3, 2}), randn({4})}); });
  EXPECT_HAS(msg, "input 1 (%b): dim 0 is 4 but symbolic size B is 3 in input 0 (%x)");
}

TEST(InterpreterErrors, OutputShapeMismatchNamesNodeAndBothTypes) {
  Interpreter interp(ir::parseGraph(R"(
    graph @g(%x: f32[4, 8] input, %w: f32[8, 2] param) {
      %y: f32[4, 5] = aten::mm(%x, %w)
      return %y
    })"));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({4, 8}), randn({8, 2})}); });
  EXPECT_HAS(msg, "node %y (aten::mm): output 0 (%y) is f32[4, 2] at run time but the IR says f32[4, 5]");
}

TEST(InterpreterErrors, OutputDtypeMismatchIsCaught) {
  Interpreter interp(ir::parseGraph(R"(
    graph @g(%x: f32[4] input) {
      %y: i64[4] = aten::relu(%x)
      return %y
    })"));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({4})}); });
  EXPECT_HAS(msg, "is f32[4] at run time but the IR says i64[4]");
}

TEST(InterpreterErrors, OutputCountMismatchListsDeclaredOutputs) {
  Interpreter interp(ir::parseGraph(R"(
    graph @g(%x: f32[4, 3] input) {
      %a: f32[2, 3], %b: f32[2, 3], %c: f32[2, 3] = aten::split.Tensor(%x, 2)
      return %a
    })"));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({4, 3})}); });
  EXPECT_HAS(msg, "node %a (aten::split.Tensor) returned 2 values but the IR declares 3 outputs (%a, %b, %c)");
}

TEST(InterpreterErrors, FailingOperatorReportsNodeAndItsMessage) {
  Interpreter interp(ir::parseGraph(R"(
    graph @g(%x: f32[4, 8] input, %w: f32[3, 2] param) {
      %y: f32[4, 2] = aten::mm(%x, %w)
      return %y
    })"));
  std::string msg = messageOf<ExecutionError>([&] { interp.run({randn({4, 8}), randn({3, 2})}); });
  EXPECT_HAS(msg, "node %y (aten::mm): ");
  EXPECT_HAS(msg, "cannot be multiplied");
}

}  // namespace
}  // namespace modelpar::runtime
