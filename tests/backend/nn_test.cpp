// torch::nn modules on the modelpar device: forward values and every
// gradient equal eager CPU (the transparency bar), training steps replay one
// captured plan, and the captured graph names layers and phases.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <modelpar/modelpar.h>

namespace {

using Factory = std::function<torch::nn::Sequential()>;

/// Builds the module twice from the same seed, runs forward + backward of
/// sum(out * w) on CPU and on modelpar, and compares outputs and gradients.
void expectGradientsEqualEager(const std::string& what, const Factory& make, const torch::Tensor& input) {
  torch::manual_seed(1);
  torch::nn::Sequential cpu = make();
  torch::manual_seed(1);
  torch::nn::Sequential dev = make();
  dev->to(modelpar::device());

  auto run = [&](torch::nn::Sequential& m, const torch::Tensor& x) {
    torch::Tensor out = m->forward(x);
    torch::manual_seed(2);
    torch::Tensor w = torch::randn(out.sizes()).to(out.device());
    (out * w).sum().backward();
    return out;
  };
  const torch::Tensor x_cpu = input.clone().requires_grad_(input.is_floating_point());
  const torch::Tensor x_dev = input.to(modelpar::device()).detach().requires_grad_(input.is_floating_point());
  const torch::Tensor want = run(cpu, x_cpu);
  const torch::Tensor got = run(dev, x_dev);
  modelpar::sync();
  EXPECT_TRUE(torch::allclose(got.cpu(), want, 1e-5, 1e-6)) << what << ": outputs differ";
  if (input.is_floating_point()) {
    EXPECT_TRUE(torch::allclose(x_dev.grad().cpu(), x_cpu.grad(), 1e-5, 1e-6)) << what << ": input grad";
  }
  auto want_params = cpu->named_parameters();
  auto got_params = dev->named_parameters();
  ASSERT_EQ(want_params.size(), got_params.size());
  for (const auto& item : want_params) {
    const torch::Tensor& g = got_params[item.key()].grad();
    ASSERT_TRUE(g.defined()) << what << ": no grad for " << item.key();
    EXPECT_EQ(g.device(), modelpar::device());
    EXPECT_TRUE(torch::allclose(g.cpu(), item.value().grad(), 1e-5, 1e-6))
        << what << ": grad of " << item.key() << "\n" << g.cpu() << "\n" << item.value().grad();
  }
  for (const auto& item : cpu->named_buffers()) {  // running statistics
    EXPECT_TRUE(torch::allclose(dev->named_buffers()[item.key()].cpu(), item.value()))
        << what << ": buffer " << item.key();
  }
}

TEST(BackendNn, GradientsOfModulesEqualEager) {
  torch::manual_seed(0);
  const torch::Tensor img = torch::randn({2, 3, 8, 8});
  const torch::Tensor seq = torch::randn({3, 5, 8});
  const torch::Tensor vec = torch::randn({4, 8});
  expectGradientsEqualEager("Linear+ReLU+Linear", [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  }, vec);
  expectGradientsEqualEager("Conv2d+BatchNorm2d+MaxPool2d", [] {
    return torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 3).padding(1)), torch::nn::BatchNorm2d(6),
        torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::AdaptiveAvgPool2d(1),
        torch::nn::Flatten(), torch::nn::Linear(6, 2));
  }, img);
  expectGradientsEqualEager("LayerNorm+GELU+Dropout(eval)", [] {
    torch::nn::Sequential s(torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                            torch::nn::Linear(8, 8), torch::nn::GELU(), torch::nn::Dropout(0.5));
    s->eval();
    return s;
  }, seq);
  expectGradientsEqualEager("Embedding+Linear", [] {
    return torch::nn::Sequential(torch::nn::Embedding(10, 6), torch::nn::Linear(6, 2));
  }, torch::randint(0, 10, {4, 5}));
  expectGradientsEqualEager("self-attention (bmm, softmax, transposes)", [] {
    struct Attention : torch::nn::Module {
      torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr};
      Attention() {
        q = register_module("q", torch::nn::Linear(8, 8));
        k = register_module("k", torch::nn::Linear(8, 8));
        v = register_module("v", torch::nn::Linear(8, 8));
      }
      torch::Tensor forward(const torch::Tensor& x) {
        torch::Tensor a = torch::softmax(torch::matmul(q(x), k(x).transpose(1, 2)) / std::sqrt(8.0), -1);
        return torch::matmul(a, v(x));
      }
    };
    return torch::nn::Sequential(std::make_shared<Attention>());
  }, seq);
  // PyTorch runs RNN cells on non-CPU devices with fused CUDA kernels; the
  // backend decomposes them (backend/decompositions.cpp).
  expectGradientsEqualEager("LSTM", [] {
    struct Lstm : torch::nn::Module {
      torch::nn::LSTM lstm{nullptr};
      Lstm() { lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(8, 4).num_layers(2))); }
      torch::Tensor forward(const torch::Tensor& x) {
        auto [out, state] = lstm->forward(x);
        return out + std::get<1>(state).sum();
      }
    };
    return torch::nn::Sequential(std::make_shared<Lstm>());
  }, seq);
  expectGradientsEqualEager("GRU", [] {
    struct Gru : torch::nn::Module {
      torch::nn::GRU gru{nullptr};
      Gru() { gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(8, 4))); }
      torch::Tensor forward(const torch::Tensor& x) { return std::get<0>(gru->forward(x)); }
    };
    return torch::nn::Sequential(std::make_shared<Gru>());
  }, seq);
}

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    fc = register_module("fc", torch::nn::Linear(4 * 6 * 6, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn(conv(x)));
    h = h + conv(x);  // residual
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Block);

std::vector<float> train(const torch::Device& dev, int steps) {
  torch::manual_seed(3);
  Block net;
  net->to(dev);
  modelpar::attach(*net);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    torch::manual_seed(100 + i);
    torch::Tensor x = torch::randn({2, 3, 6, 6}).to(dev);
    torch::Tensor y = torch::randn({2, 3}).to(dev);
    opt.zero_grad();
    torch::Tensor loss = torch::mse_loss(net->forward(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<float>());
  }
  return losses;
}

TEST(BackendNn, TrainingStepsReplayOnePlanAndMatchEager) {
  const std::vector<float> want = train(torch::kCPU, 5);
  modelpar::clearPlans();
  modelpar::resetCounters();
  const std::vector<float> got = train(modelpar::device(), 5);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << i;
  const modelpar::Counters c = modelpar::counters();
  EXPECT_EQ(c.captures, 1);
  EXPECT_EQ(c.replays, 4);
  EXPECT_EQ(c.graph_breaks, 0);
  ASSERT_EQ(modelpar::plans().size(), 1u);
  EXPECT_EQ(modelpar::plans()[0].runs, 5);

  // Layers from parameter ownership; forward, backward and update phases.
  const std::string g = modelpar::lastGraph();
  EXPECT_NE(g.find("%conv.weight: f32[4, 3, 3, 3] param"), std::string::npos) << g;
  EXPECT_NE(g.find("%bn.running_mean: f32[4] buffer"), std::string::npos) << g;
  EXPECT_NE(g.find("aten::convolution(%x, %conv.weight"), std::string::npos) << g;
  EXPECT_NE(g.find("aten::_native_batch_norm_legit_functional"), std::string::npos) << g;
  EXPECT_NE(g.find("{layer=\"conv\", phase=fwd}"), std::string::npos) << g;
  EXPECT_NE(g.find("aten::convolution_backward"), std::string::npos) << g;
  EXPECT_NE(g.find("{layer=\"conv\", phase=bwd}"), std::string::npos) << g;
  EXPECT_NE(g.find("{layer=\"fc\", phase=update}"), std::string::npos) << g;
}

TEST(BackendNn, ScopesNameLayers) {
  torch::Tensor x = torch::randn({3, 3}).to(modelpar::device());
  torch::Tensor y;
  {
    modelpar::Scope block("block1");
    modelpar::Scope inner("act");
    y = torch::tanh(x);
  }
  y = y * 2;
  modelpar::sync();
  const std::string g = modelpar::lastGraph();
  EXPECT_NE(g.find("aten::tanh(%x) {layer=\"block1.act\", phase=fwd}"), std::string::npos) << g;
}

// The dispatch-key front end marks a recorded node random from its schema's
// nondeterministic_seeded tag (checkpoint keeps it stored, the executors
// reseed it), so the mark does not hang on the op's name.
TEST(BackendNn, RecordedRandomOpsAreMarkedFromTheirSchemaTag) {
  torch::Tensor x = torch::randn({4, 3}).to(modelpar::device());
  torch::Tensor y = torch::dropout(torch::tanh(x), 0.5, /*train=*/true) * 2;
  modelpar::sync();
  const std::string g = modelpar::lastGraph();
  int drawing = 0;
  std::istringstream lines(g);
  for (std::string line; std::getline(lines, line);) {
    const bool draws = line.find("bernoulli") != std::string::npos ||
                       line.find("native_dropout(") != std::string::npos;
    drawing += draws;
    EXPECT_EQ(line.find("random=true") != std::string::npos, draws) << line << "\n" << g;
  }
  EXPECT_GE(drawing, 1) << g;
}

}  // namespace
