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
  // The names whose overloads carry PyTorch's nondeterministic_seeded tag,
  // the samplers and dropouts among them (not the attention kernels and
  // RNNs that draw only with dropout > 0, which the tag also marks): the
  // in-place samplers eager code calls, and the functional forms
  // AOTAutograd's functionalization emits for them.
  static constexpr std::string_view kRandom[] = {
      // dropout
      "aten::native_dropout", "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
      "aten::feature_alpha_dropout", "aten::_fused_dropout",
      // factories
      "aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint",
      "aten::randint_like", "aten::randperm",
      // samplers: in place, and functional
      "aten::bernoulli", "aten::bernoulli_", "aten::uniform", "aten::uniform_", "aten::normal",
      "aten::normal_", "aten::normal_functional", "aten::exponential", "aten::exponential_",
      "aten::geometric", "aten::geometric_", "aten::cauchy", "aten::cauchy_",
      "aten::log_normal", "aten::log_normal_", "aten::random", "aten::random_",
      "aten::multinomial", "aten::poisson", "aten::binomial", "aten::_standard_gamma",
      "aten::_sample_dirichlet",
      // randomized leaky relu
      "aten::rrelu", "aten::rrelu_", "aten::rrelu_with_noise", "aten::rrelu_with_noise_",
      "aten::rrelu_with_noise_functional"};
  return std::find(std::begin(kRandom), std::end(kRandom), op) != std::end(kRandom);
}

bool isRandom(const Node& n) { return n.random || isRandomOp(n.op); }

}  // namespace modelpar::ir
