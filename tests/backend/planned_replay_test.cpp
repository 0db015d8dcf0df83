// The device's options and planned replay: modelpar::configure() checks
// every option up front with torch.compile's names and words; with devices
// > 1 a captured step is placed (m-ETF, m-TOPO, m-SCT) and run on CPU worker
// devices, equal to eager; the plan cache is bounded (LRU, counted); the
// numbers an optimizer update reads are graph inputs, so changing them
// replays the same plan.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <string>
#include <vector>

#include <modelpar/modelpar.h>

#include "ir/error.h"

namespace {

/// Restores the default options (and drops their plans) when a test ends.
struct DefaultOptionsAfter {
  ~DefaultOptionsAfter() { modelpar::configure(modelpar::Options{}); }
};

at::Tensor dev(const at::Tensor& t) { return t.to(modelpar::device()); }

/// A two-layer MLP forward, the same ops on any device.
at::Tensor mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  return at::relu(x.mm(w1)).mm(w2).tanh();
}

struct BadOptions {
  const char* what;
  modelpar::Options options;
  const char* message;
};

std::vector<BadOptions> badOptions() {
  std::vector<BadOptions> cases;
  auto add = [&](const char* what, auto edit, const char* message) {
    modelpar::Options o;
    edit(o);
    cases.push_back({what, o, message});
  };
  add("no devices", [](auto& o) { o.devices = 0; },
      "modelpar options: devices=0 is not valid; devices takes an int from 1 to 64");
  add("too many devices", [](auto& o) { o.devices = 65; }, "devices=65 is not valid");
  add("unknown placer", [](auto& o) { o.devices = 2; o.placer = "m-best"; },
      "placer='m-best' is not valid; placer takes one of 'm-topo', 'm-etf', 'm-sct'");
  add("placer on one device", [](auto& o) { o.placer = "m-sct"; },
      "placer='m-sct' needs devices > 1");
  add("unknown device map", [](auto& o) { o.devices = 2; o.device_map = "gpu"; },
      "device_map='gpu' is not valid; device_map takes 'cpu', 'cuda', 'cuda:K'");
  add("device list of the wrong length", [](auto& o) { o.devices = 3; o.device_map = "cuda:0,cuda:1"; },
      "names 2 devices but devices=3");
  add("no memory", [](auto& o) { o.memory = 0; }, "memory=0 is not valid");
  add("no cached plans", [](auto& o) { o.max_plans = 0; },
      "max_plans=0 is not valid; max_plans takes an int >= 1");
  add("unknown schedule", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->schedule = "zigzag"; },
      "schedule='zigzag' is not valid; schedule takes one of 'gpipe', '1f1b', '1f1b*'");
  add("renamed partition", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->partition = "pipedream"; },
      "partition='pipedream' is now called 'balance-time-comm'");
  add("madpipe without 1f1b*", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->partition = "madpipe"; },
      "'madpipe' only with schedule '1f1b*'");
  add("no micro-batches", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->microbatches = 0; },
      "pipeline['microbatches']=0 is not valid");
  add("virtual stages without interleaved", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->virtual_stages = 2; },
      "pipeline['virtual_stages']=2 is not valid; virtual_stages takes more than 1 only with schedule 'interleaved' (got 'gpipe')");
  add("zb-v with 3 virtual stages", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->schedule = "zb-v"; o.pipeline->virtual_stages = 3; },
      "pipeline['virtual_stages']=3 is not valid; schedule 'zb-v' runs exactly 2 stages per device, placed in a V");
  add("negative virtual stages", [](auto& o) { o.devices = 2; o.pipeline = modelpar::PipelineOptions{}; o.pipeline->schedule = "interleaved"; o.pipeline->virtual_stages = -1; },
      "pipeline['virtual_stages']=-1 is not valid; virtual_stages takes an int >= 0");
  return cases;
}

TEST(BackendPlannedReplay, ConfigureRefusesBadOptionsNamingThemAndChangesNothing) {
  DefaultOptionsAfter restore;
  modelpar::Options good;
  good.devices = 2;
  good.max_plans = 5;
  modelpar::configure(good);
  for (const BadOptions& c : badOptions()) {
    try {
      modelpar::configure(c.options);
      ADD_FAILURE() << c.what << ": no error";
    } catch (const modelpar::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << c.what << ": " << e.what();
    }
    EXPECT_EQ(modelpar::options().devices, 2) << c.what;
    EXPECT_EQ(modelpar::options().max_plans, 5) << c.what;
  }
}

TEST(BackendPlannedReplay, StepPlacedOnTwoAndFourWorkersEqualsEagerAndReplays) {
  DefaultOptionsAfter restore;
  at::manual_seed(0);
  const at::Tensor w1 = at::randn({16, 32}) / 4, w2 = at::randn({32, 8}) / 6;
  for (const char* placer : {"m-etf", "m-topo", "m-sct"}) {
    for (int devices : {2, 4}) {
      modelpar::Options o;
      o.devices = devices;
      o.placer = placer;
      modelpar::configure(o);
      modelpar::resetCounters();
      const at::Tensor dw1 = dev(w1), dw2 = dev(w2);
      for (int step = 0; step < 3; ++step) {
        const at::Tensor x = at::randn({4, 16});
        const at::Tensor got = mlp(dev(x), dw1, dw2).cpu();
        // One op never spans devices, so each runs the kernel eager runs; a
        // CPU worker has one intra-op thread, which may sum a 16- or 32-long
        // dot product in another order: 2 * 4 * sqrt(32) * 2^-24 per
        // reduction, two in sequence, is about 5e-6.
        EXPECT_TRUE(at::allclose(got, mlp(x, w1, w2), 1e-5, 1e-6)) << placer << " " << devices;
      }
      const modelpar::Counters c = modelpar::counters();
      EXPECT_EQ(c.captures, 1) << placer << " " << devices;
      EXPECT_EQ(c.replays, 2) << placer << " " << devices;
      const std::string summary = modelpar::lastPlan();
      EXPECT_NE(summary.find("runs: 3 steps (2 replayed)"), std::string::npos) << summary;
      EXPECT_NE(summary.find(std::to_string(devices) + " cpu-workers"), std::string::npos) << summary;
      EXPECT_NE(summary.find(std::string("placer ") + placer + ", " + std::to_string(devices) + " devices"),
                std::string::npos)
          << summary;
      ASSERT_EQ(modelpar::plans().size(), 1u);
      EXPECT_EQ(modelpar::plans()[0].summary, summary);
    }
  }
}

TEST(BackendPlannedReplay, ChangingAPlanningOptionDropsThePlans) {
  DefaultOptionsAfter restore;
  const at::Tensor x = dev(at::ones({2, 2}));
  (x * 3).cpu();
  EXPECT_EQ(modelpar::plans().size(), 1u);
  modelpar::Options o;
  o.strict = true;  // not a planning option: plans stay
  modelpar::configure(o);
  EXPECT_EQ(modelpar::plans().size(), 1u);
  o.devices = 2;
  modelpar::configure(o);
  EXPECT_TRUE(modelpar::plans().empty());
  EXPECT_NE(modelpar::lastPlan().find("the CPU interpreter"), std::string::npos);  // the last one that ran
}

TEST(BackendPlannedReplay, LeastRecentlyUsedPlanIsEvictedAndCounted) {
  DefaultOptionsAfter restore;
  modelpar::Options o;
  o.max_plans = 2;
  modelpar::configure(o);
  modelpar::clearPlans();
  modelpar::resetCounters();
  auto step = [](int64_t n) { return (dev(at::ones({n})) * 2).sum().item<float>(); };
  EXPECT_EQ(step(1), 2.0f);  // capture A
  EXPECT_EQ(step(2), 4.0f);  // capture B
  EXPECT_EQ(step(1), 2.0f);  // replay A: B is now the least recently used
  EXPECT_EQ(step(3), 6.0f);  // capture C, evicts B
  EXPECT_EQ(step(1), 2.0f);  // replay A
  EXPECT_EQ(step(2), 4.0f);  // capture B again, evicts C
  modelpar::Counters c = modelpar::counters();
  EXPECT_EQ(c.captures, 4);
  EXPECT_EQ(c.replays, 2);
  EXPECT_EQ(c.evictions, 2);
  ASSERT_EQ(modelpar::plans().size(), 2u);
  EXPECT_NE(modelpar::plans()[0].graph.find("f32[1]"), std::string::npos);  // A, captured first
  EXPECT_NE(modelpar::plans()[1].graph.find("f32[2]"), std::string::npos);
  o.max_plans = 1;  // shrinking the cache evicts at once
  modelpar::configure(o);
  EXPECT_EQ(modelpar::counters().evictions, 3);
  ASSERT_EQ(modelpar::plans().size(), 1u);
  EXPECT_NE(modelpar::plans()[0].graph.find("f32[2]"), std::string::npos);
}

TEST(BackendPlannedReplay, UpdateScalarsAreGraphInputsSoANewLearningRateReplays) {
  DefaultOptionsAfter restore;
  modelpar::Options o;
  o.devices = 2;
  modelpar::configure(o);
  modelpar::resetCounters();
  at::manual_seed(0);
  const at::Tensor w0 = at::randn({4, 3}), x = at::randn({5, 4});
  at::Tensor w_cpu = w0.clone().requires_grad_();
  at::Tensor w_dev = dev(w0).requires_grad_();
  for (double lr : {0.1, 0.25, 0.05}) {
    for (at::Tensor* w : {&w_cpu, &w_dev}) {
      w->mutable_grad().reset();
      const at::Tensor xs = w->device() == x.device() ? x : dev(x);
      (xs.mm(*w) * 0.5).tanh().sum().backward();  // 0.5: a forward constant
      at::NoGradGuard no_grad;
      w->add_(w->grad(), -lr);  // alpha: a per-step scalar of the update
    }
    EXPECT_TRUE(at::allclose(w_dev.cpu(), w_cpu, 1e-6, 1e-7)) << lr;
  }
  EXPECT_EQ(modelpar::counters().captures, 1);
  EXPECT_EQ(modelpar::counters().replays, 2);
  const std::string g = modelpar::lastGraph();
  EXPECT_NE(g.find(": float input"), std::string::npos) << g;  // the learning rate
  EXPECT_NE(g.find("0.5"), std::string::npos) << g;            // the forward constant stays
  EXPECT_EQ(g.find("-0.05"), std::string::npos) << g;
}

TEST(BackendPlannedReplay, StepThatDoesNotFitRaisesAndCachesNothing) {
  DefaultOptionsAfter restore;
  modelpar::Options o;
  o.devices = 2;
  o.memory = 256;  // bytes per device; the step's weights alone need 4 KiB
  modelpar::configure(o);
  modelpar::resetCounters();
  const at::Tensor w = dev(at::ones({32, 32}));
  EXPECT_THROW(w.mm(w).sum().item<float>(), modelpar::PlanDoesNotFitError);
  EXPECT_EQ(modelpar::counters().captures, 0);
  EXPECT_TRUE(modelpar::plans().empty());
  o.memory.reset();
  modelpar::configure(o);
  EXPECT_EQ(w.mm(w).sum().item<float>(), 32.0f * 32 * 32);
}

/// One SGD step of the MLP with a sum-of-squares loss; returns the loss.
float sgdStep(at::Tensor& w1, at::Tensor& w2, const at::Tensor& x, const at::Tensor& y) {
  w1.mutable_grad().reset();
  w2.mutable_grad().reset();
  at::Tensor loss = (mlp(x, w1, w2) - y).pow(2).sum();
  loss.backward();
  {
    at::NoGradGuard no_grad;
    w1.sub_(w1.grad() * 0.05);
    w2.sub_(w2.grad() * 0.05);
  }
  return loss.item<float>();
}

TEST(BackendPlannedReplay, PipelinedStepEqualsEagerForEverySchedule) {
  DefaultOptionsAfter restore;
  // Two layers: interleaved with one stage per device (v = 2 needs 4).
  for (const char* schedule : {"gpipe", "1f1b", "1f1b*", "interleaved"}) {
    modelpar::Options o;
    o.devices = 2;
    o.pipeline = modelpar::PipelineOptions{};
    o.pipeline->microbatches = 3;
    o.pipeline->schedule = schedule;
    if (std::string(schedule) == "interleaved") o.pipeline->virtual_stages = 1;
    modelpar::configure(o);
    modelpar::resetCounters();
    at::manual_seed(0);
    at::Tensor w1 = (at::randn({16, 32}) / 4).requires_grad_();
    at::Tensor w2 = (at::randn({32, 8}) / 6).requires_grad_();
    at::Tensor d1 = dev(w1.detach()).requires_grad_(), d2 = dev(w2.detach()).requires_grad_();
    // Layers (fc1, fc2) from the parameters' names: a pipeline cuts between them.
    modelpar::nameTensor(d1, "fc1.weight", modelpar::TensorRole::Parameter);
    modelpar::nameTensor(d2, "fc2.weight", modelpar::TensorRole::Parameter);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor x = at::randn({10, 16}), y = at::randn({10, 8});
      const float want = sgdStep(w1, w2, x, y);
      const float got = sgdStep(d1, d2, dev(x), dev(y));
      // Micro-batches of 4, 4, 2 add the weight gradients up in three parts:
      // another fp32 order (tests/python/tolerances.py: 2 * 4 * sqrt(32) *
      // 2^-24 per reduction, a few in sequence, over 3 steps: about 1e-5).
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << schedule << " step " << step;
    }
    EXPECT_TRUE(at::allclose(d1.detach().cpu(), w1.detach(), 1e-5, 1e-6)) << schedule;
    EXPECT_EQ(modelpar::counters().captures, 1) << schedule;
    const std::string summary = modelpar::lastPlan();
    EXPECT_NE(summary.find(std::string("3 micro-batches of 4, schedule ") + schedule), std::string::npos)
        << summary;
    EXPECT_NE(summary.find("batch 10 (inputs %x, %x_1; dimension 0)"), std::string::npos) << summary;
  }
}

TEST(BackendPlannedReplay, PipelineRefusesAStepThatComputesANumberFromTheBatchSize) {
  DefaultOptionsAfter restore;
  modelpar::Options o;
  o.devices = 2;
  o.pipeline = modelpar::PipelineOptions{};
  o.pipeline->microbatches = 2;
  modelpar::configure(o);
  modelpar::resetCounters();
  at::manual_seed(0);
  at::Tensor w1 = dev(at::randn({16, 32})).requires_grad_();
  at::Tensor w2 = dev(at::randn({32, 8})).requires_grad_();
  modelpar::nameTensor(w1, "fc1.weight", modelpar::TensorRole::Parameter);
  modelpar::nameTensor(w2, "fc2.weight", modelpar::TensorRole::Parameter);
  // mean()'s backward divides by the element count, 10 * 8, a constant that
  // stays 80 in every micro-batch: the first run's check catches it.
  mlp(dev(at::randn({10, 16})), w1, w2).mean().backward();
  try {
    modelpar::sync();
    ADD_FAILURE() << "no error";
  } catch (const modelpar::UnsupportedOpError& e) {
    EXPECT_NE(std::string(e.what()).find("the micro-batched step differs from the captured step"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(w1.grad().defined() && w1.grad().cpu().abs().sum().item<float>() != 0);  // nothing applied
}

TEST(BackendPlannedReplay, PipelineAsksWhichInputsAreBatchedWhenTheyDisagree) {
  DefaultOptionsAfter restore;
  modelpar::Options o;
  o.devices = 2;
  o.pipeline = modelpar::PipelineOptions{};
  modelpar::configure(o);
  const at::Tensor a = dev(at::ones({10, 16})), b = dev(at::ones({12, 16}));
  EXPECT_THROW((a.sum() + b.sum()).item<float>(), modelpar::ConfigError);
  at::manual_seed(0);
  at::Tensor w1 = dev(at::randn({16, 32})).requires_grad_();
  at::Tensor w2 = dev(at::randn({32, 8})).requires_grad_();
  modelpar::nameTensor(w1, "fc1.weight", modelpar::TensorRole::Parameter);
  modelpar::nameTensor(w2, "fc2.weight", modelpar::TensorRole::Parameter);
  const at::Tensor x = dev(at::randn({12, 16})), y = dev(at::randn({12, 8}));
  const at::Tensor mask = dev(at::ones({2, 8}));  // leading size 2: not the batch
  modelpar::nameTensor(x, "images", modelpar::TensorRole::Input);
  modelpar::nameTensor(y, "labels", modelpar::TensorRole::Input);
  o.pipeline->batched_inputs = {"images", "labels"};
  o.pipeline->microbatches = 2;
  modelpar::configure(o);
  at::Tensor loss = (mlp(x, w1, w2) * mask.mean() - y).pow(2).sum();
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<float>()));
  EXPECT_NE(modelpar::lastPlan().find("batch 12 (inputs %images, %labels; dimension 0)"), std::string::npos)
      << modelpar::lastPlan();
}

}  // namespace
