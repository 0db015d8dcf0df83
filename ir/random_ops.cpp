#include "ir/random_ops.h"

#include <algorithm>
#include <iterator>

namespace modelpar::ir {

bool isRandomOp(std::string_view op) {
  // By the operator's name without its overload: aten::bernoulli.p and
  // aten::randint.low draw as aten::bernoulli and aten::randint do.
  const size_t ns = op.find("::");
  const size_t dot = op.find('.', ns == std::string_view::npos ? 0 : ns + 2);
  if (dot != std::string_view::npos) op = op.substr(0, dot);
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
