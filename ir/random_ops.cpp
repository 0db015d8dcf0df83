#include "ir/random_ops.h"

#include <algorithm>
#include <iterator>

namespace modelpar::ir {

bool isRandomOp(std::string_view op) {
  static constexpr std::string_view kRandom[] = {
      "aten::native_dropout", "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
      "aten::feature_alpha_dropout", "aten::bernoulli", "aten::bernoulli_", "aten::rand",
      "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint", "aten::randint_like",
      "aten::randperm", "aten::multinomial", "aten::normal", "aten::normal_", "aten::uniform_",
      "aten::exponential_", "aten::geometric_", "aten::cauchy_", "aten::log_normal_",
      "aten::random_", "aten::rrelu", "aten::rrelu_with_noise", "aten::poisson"};
  return std::find(std::begin(kRandom), std::end(kRandom), op) != std::end(kRandom);
}

}  // namespace modelpar::ir
