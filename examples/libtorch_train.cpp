// Trains a small torch::nn model (conv + batch norm + linear, with a residual
// add) for 20 steps on the modelpar device, then the same program eagerly on
// the CPU, and checks that the two loss trajectories agree (fp32, rtol 1e-5)
// and that every step after the first replayed the plan captured by the
// first (captures == 1).
//
// Build in the tree (target libtorch_train), or as a standalone project:
//   cmake -S examples/libtorch_train -B build-example \
//         -DCMAKE_PREFIX_PATH="$(python -c 'import modelpar; print(modelpar.cmake_prefix_path)')"
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <modelpar/modelpar.h>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(8));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(8));
    fc = register_module("fc", torch::nn::Linear(8 * 8 * 8, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn1(conv1(x)));
    h = torch::relu(h + bn2(conv2(h)));  // residual block
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

std::vector<float> train(const torch::Device& device, int steps) {
  torch::manual_seed(0);
  Net net;
  net->to(device);
  modelpar::attach(*net);  // names parameters: layers conv1, bn1, ... in the IR
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.0));
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(1000 + step);  // the same batches on both devices
    torch::Tensor x = torch::randn({4, 3, 8, 8}).to(device);
    torch::Tensor y = torch::randint(0, 10, {4}).to(device);
    optimizer.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<float>());  // reading the loss runs the step
  }
  return losses;
}

}  // namespace

int main() {
  constexpr int kSteps = 20;
  const std::vector<float> captured = train(modelpar::device(), kSteps);
  const modelpar::Counters counters = modelpar::counters();
  const std::vector<float> eager = train(torch::kCPU, kSteps);

  bool ok = true;
  std::printf("step  modelpar      eager\n");
  for (int i = 0; i < kSteps; ++i) {
    const bool same = std::abs(captured[i] - eager[i]) <= 1e-5f * std::abs(eager[i]) + 1e-7f;
    ok = ok && same;
    std::printf("%4d  %.7f  %.7f%s\n", i, captured[i], eager[i], same ? "" : "  <-- differs");
  }
  std::printf("captures %lld, replays %lld, graph breaks %lld, ops recorded %lld\n",
              static_cast<long long>(counters.captures), static_cast<long long>(counters.replays),
              static_cast<long long>(counters.graph_breaks),
              static_cast<long long>(counters.ops_recorded));
  if (counters.captures != 1 || counters.replays != kSteps - 1) {
    std::printf("expected 1 capture and %d replays\n", kSteps - 1);
    ok = false;
  }
  std::printf(ok ? "OK: the modelpar run matches eager CPU\n" : "FAILED\n");
  return ok ? 0 : 1;
}
