// isRandomOp: by the operator's name, whatever its overload (the fallback
// for nodes without the `random` mark: tests/ir/random_mark_test.cpp).
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

// The functional forms AOTAutograd's functionalization emits for the
// in-place samplers (uniform_ -> uniform, ...) and the samplers with no
// in-place form: all carry the nondeterministic_seeded tag in PyTorch.
TEST(IsRandomOp, KnowsTheFunctionalSamplersAotAutogradEmits) {
  for (const char* op :
       {"aten::uniform", "aten::uniform.default", "aten::exponential", "aten::normal_functional",
        "aten::random", "aten::random.from", "aten::random.to", "aten::geometric",
        "aten::log_normal", "aten::cauchy", "aten::binomial", "aten::_standard_gamma",
        "aten::_sample_dirichlet", "aten::rrelu_with_noise_functional",
        "aten::native_dropout.out", "aten::_fused_dropout", "aten::_sample_dirichlet.out",
        "aten::poisson.out", "aten::multinomial.out", "aten::bernoulli.Tensor_functional"}) {
    EXPECT_TRUE(isRandomOp(op)) << op;
  }
  // Their backward and non-drawing neighbours are not.
  for (const char* op : {"aten::_standard_gamma_grad", "aten::_dirichlet_grad",
                         "aten::rrelu_with_noise_backward", "aten::uniform_like_not_an_op"}) {
    EXPECT_FALSE(isRandomOp(op)) << op;
  }
}

}  // namespace
}  // namespace modelpar::ir
