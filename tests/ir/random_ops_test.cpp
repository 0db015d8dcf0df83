// isRandomOp: by the operator's name, whatever its overload.
#include "ir/random_ops.h"

#include <gtest/gtest.h>

namespace modelpar::ir {
namespace {

TEST(IsRandomOp, KnowsTheDrawingOpsWhateverTheOverload) {
  for (const char* op : {"aten::native_dropout", "aten::bernoulli", "aten::bernoulli.p",
                         "aten::bernoulli_.float", "aten::randint.low", "aten::randn_like",
                         "aten::normal.Tensor_float", "aten::randperm", "aten::rand.generator"}) {
    EXPECT_TRUE(isRandomOp(op)) << op;
  }
  for (const char* op : {"aten::mm", "aten::add.Tensor", "aten::native_dropout_backward",
                         "aten::randomize_not_an_op", "aten::dropout_like", "modelpar::sym_add"}) {
    EXPECT_FALSE(isRandomOp(op)) << op;
  }
}

}  // namespace
}  // namespace modelpar::ir
