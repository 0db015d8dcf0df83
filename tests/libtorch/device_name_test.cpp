// The modelpar device as LibTorch programs name it: `torch::Device
// dev("modelpar")` before any modelpar function, as PyTorch users write
// device code. Its own binary, and each test a process of its own (ctest),
// so nothing has named the device before the test's first line does: only
// loading libmodelpar.so has run (Note [Naming the device is not free] in
// backend/device.cpp). Compiled with torch/torch.h, as those programs are.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <modelpar/modelpar.h>

namespace {

// A linear model and one SGD step, the step's loss and updated weight.
struct Step {
  float loss;
  torch::Tensor weight;
};

Step trainOneStep(const torch::Device& dev) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  model->to(dev);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor x = torch::randn({3, 4}).to(dev);
  const torch::Tensor y = torch::randn({3, 2}).to(dev);
  opt.zero_grad();
  torch::Tensor loss = torch::mse_loss(model->forward(x), y);
  loss.backward();
  opt.step();
  return {loss.item<float>(), model->weight.detach().to(torch::kCPU)};
}

// Where no GPU is visible (this build's torch has no CUDA, or none is
// attached) the library names the device when it loads.
TEST(LibtorchDeviceName, ModelToTheModelparDeviceBeforeAnyModelparCallTrainsLikeEager) {
  if (torch::cuda::is_available()) {
    GTEST_SKIP() << "a GPU is visible: the device is named by modelpar::device() "
                    "(Note [Naming the device is not free])";
  }
  const torch::Device dev("modelpar");  // the first line that names it
  EXPECT_EQ(dev.type(), c10::DeviceType::PrivateUse1);
  const Step captured = trainOneStep(dev);
  EXPECT_EQ(dev, torch::Device(modelpar::device().type()));
  EXPECT_EQ(modelpar::device().str(), "modelpar:0");
  const Step eager = trainOneStep(torch::kCPU);
  EXPECT_NEAR(captured.loss, eager.loss, 1e-5 * std::abs(eager.loss));
  EXPECT_TRUE(torch::allclose(captured.weight, eager.weight, 1e-5, 1e-7));
}

TEST(LibtorchDeviceName, TheNameParsesWithAnIndex) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(torch::Device("modelpar:0"), torch::Device(c10::DeviceType::PrivateUse1, 0));
  EXPECT_EQ(torch::ones({2}).to("modelpar").device().str(), "modelpar:0");
}

}  // namespace
