// The modelpar device itself: its name, moving data in and out, reading
// values (each a materialisation point), and a step that fails while running.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <ATen/ATen.h>
#include <modelpar/modelpar.h>

#include "ir/error.h"

namespace {

// Each test runs in a process of its own (ctest), so this one sees the
// library freshly loaded: modelpar::device() is PrivateUse1 named "modelpar"
// (named when the library loaded where no GPU is visible, else by this call:
// Note [Naming the device is not free] in backend/device.cpp; the program
// that names it first with torch::Device is tests/libtorch/).
TEST(BackendDevice, IsPrivateUse1NamedModelparOnFirstUse) {
  EXPECT_EQ(modelpar::device(), c10::Device(c10::DeviceType::PrivateUse1, 0));
  EXPECT_EQ(c10::get_privateuse1_backend(), "modelpar");
  EXPECT_EQ(c10::Device("modelpar"), c10::Device(c10::DeviceType::PrivateUse1));
  EXPECT_EQ(modelpar::device(), c10::Device("modelpar:0"));
  const at::Tensor t = at::ones({2}).to(c10::Device("modelpar"));
  EXPECT_EQ(t.device().str(), "modelpar:0");
  EXPECT_TRUE(t.is_privateuseone());
}

TEST(BackendDevice, OnlyOneDeviceIndex) {
  (void)modelpar::device();
  try {
    (void)at::ones({2}).to(c10::Device("modelpar:1"));
    FAIL() << "modelpar:1 should not exist";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("one modelpar device"), std::string::npos) << e.what();
  }
}

TEST(BackendDevice, RoundTripsDtypesAndLayouts) {
  const at::Tensor x = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor xt = x.t();  // non-contiguous source
  EXPECT_TRUE(at::equal(xt.to(modelpar::device()).to(at::kCPU), xt));
  EXPECT_TRUE(at::equal(x.to(modelpar::device(), at::kDouble).cpu(), x.to(at::kDouble)));
  const at::Tensor m = x.to(modelpar::device());
  EXPECT_TRUE(at::equal(m.to(at::kHalf).to(at::kCPU), x.to(at::kHalf)));  // converted on the device
  EXPECT_TRUE(at::equal(m.to(at::kCPU, at::kInt), x.to(at::kInt)));      // converted on the way out
}

TEST(BackendDevice, ReadingValuesMaterialises) {
  modelpar::resetCounters();
  const at::Tensor m = at::arange(6, at::kFloat).to(modelpar::device());
  const at::Tensor s = (m * 2).sum();
  EXPECT_EQ(modelpar::counters().syncs, 0);  // recorded, not run
  EXPECT_EQ(s.item<float>(), 30.0f);
  EXPECT_EQ(modelpar::counters().syncs, 1);
  std::ostringstream os;
  os << m + 1;
  EXPECT_NE(os.str().find("6"), std::string::npos) << os.str();
  EXPECT_EQ(modelpar::counters().syncs, 2);
  modelpar::sync();  // nothing pending: no graph
  EXPECT_EQ(modelpar::counters().syncs, 2);
}

TEST(BackendDevice, IdenticalStepsReplayAndDifferentOnesCapture) {
  modelpar::clearPlans();
  modelpar::resetCounters();
  for (int i = 0; i < 3; ++i) {
    at::Tensor a = at::full({4}, static_cast<double>(i)).to(modelpar::device());
    EXPECT_EQ((a * 3).sum().item<float>(), 12.0f * static_cast<float>(i));
  }
  at::Tensor b = at::ones({5}).to(modelpar::device());  // another shape: another graph
  EXPECT_EQ((b * 3).sum().item<float>(), 15.0f);
  const modelpar::Counters c = modelpar::counters();
  EXPECT_EQ(c.captures, 2);
  EXPECT_EQ(c.replays, 2);
  ASSERT_EQ(modelpar::plans().size(), 2u);
  EXPECT_EQ(modelpar::plans()[0].runs, 3);
}

TEST(BackendDevice, AnOpFailingInAStepIsAnExecutionErrorNamingIt) {
  const at::Tensor x = at::randn({4, 3}).to(modelpar::device());
  const at::Tensor idx = at::tensor({0, 9}, at::kLong).to(modelpar::device());  // 9 is out of range
  at::Tensor y = at::index_select(x, 0, idx);  // shapes are fine: recorded
  try {
    modelpar::sync();
    FAIL() << "the step should fail";
  } catch (const modelpar::ExecutionError& e) {
    EXPECT_NE(std::string(e.what()).find("aten::index_select"), std::string::npos) << e.what();
  }
  // The session goes on.
  EXPECT_EQ((x * 0).sum().item<float>(), 0.0f);
}

}  // namespace
