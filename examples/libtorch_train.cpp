// Trains a small torch::nn model (conv + batch norm + linear, with a residual
// add) for 20 steps on the modelpar device and the same program eagerly on
// the CPU, and checks that the loss trajectories agree:
//   1. one device (the interpreter), SGD: every step after the first replays
//      the plan the first captured (captures == 1);
//   2. the step placed with m-ETF over 2 and over 4 CPU worker devices
//      (modelpar::configure), SGD: captures == 1 again;
//   3. Adam with a step learning-rate schedule on 2 devices: the learning
//      rate and Adam's bias corrections change every step, yet they are graph
//      inputs (Note [Per-step scalars are inputs]), so the loop captures 2
//      plans (Adam creates its state in the first step) and replays them;
//   4. a 2-stage 1F1B pipeline of 3 micro-batches (the model without its
//      batch norm), the batch dimension found by the device.
// It prints the placement summary of the last plan (modelpar::lastPlan()).
//
// Build in the tree (target libtorch_train), or as a standalone project:
//   cmake -S examples/libtorch_train -B build-example \
//         -DCMAKE_PREFIX_PATH="$(python -c 'import modelpar; print(modelpar.cmake_prefix_path)')"
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <modelpar/modelpar.h>

namespace {

/// With batch_norm off, the batch-norm layers are left out: a pipeline
/// normalises each micro-batch with its own statistics (deferred batch norm,
/// as torchgpipe), so only a model without batch norm can equal eager there.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool batch_norm = true) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)));
    if (batch_norm) {
      bn1 = register_module("bn1", torch::nn::BatchNorm2d(8));
      bn2 = register_module("bn2", torch::nn::BatchNorm2d(8));
    }
    fc = register_module("fc", torch::nn::Linear(8 * 8 * 8, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = conv1(x);
    h = torch::relu(bn1 ? bn1(h) : h);
    torch::Tensor r = conv2(h);
    h = torch::relu(h + (bn2 ? bn2(r) : r));  // residual block
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

enum class Optim { Sgd, AdamWithSchedule };

// 6: the pipeline finds the batch dimension by its size, which must differ
// from every other size of the model (3, 8, 10, 512) and exceed the rank of
// its tensors (4).
constexpr int64_t kBatch = 6;

std::vector<float> train(const torch::Device& device, int steps, Optim kind, bool batch_norm) {
  torch::manual_seed(0);
  Net net(batch_norm);
  net->to(device);
  modelpar::attach(*net);  // names parameters: layers conv1, bn1, ... in the IR
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<torch::optim::StepLR> schedule;
  if (kind == Optim::Sgd) {
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(0.01).momentum(0.0));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.003));
    schedule = std::make_unique<torch::optim::StepLR>(*optimizer, /*step_size=*/3, /*gamma=*/0.7);
  }
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(1000 + step);  // the same batches on both devices
    torch::Tensor x = torch::randn({kBatch, 3, 8, 8}).to(device);
    torch::Tensor y = torch::randint(0, 10, {kBatch}).to(device);
    optimizer->zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    optimizer->step();
    if (schedule) schedule->step();
    losses.push_back(loss.item<float>());  // reading the loss runs the step
  }
  return losses;
}

struct Run {
  std::string name;
  int devices;
  Optim optim;
  bool pipeline;  // a 2-stage 1F1B pipeline of 3 micro-batches instead of placement
  int64_t max_captures;
  // Relative tolerance on each loss. One device runs the kernels eager CPU
  // runs, on the calling thread: equal up to 1e-5. CPU workers run each op
  // with one intra-op thread, so a conv or matmul may add its fp32 sums in
  // another order than eager's threads; tests/python/tolerances.py's bound
  // for that is 2 * 4 * sqrt(n) * 2^-24 per reduction of length n, times
  // the reductions in sequence and the optimizer steps: n = 512 (fc's input),
  // 6 reductions (3 layers, forward and backward), 20 steps: 1.3e-3.
  double rtol;
};

}  // namespace

int main() {
  constexpr int kSteps = 20;
  const double kReordered = 2 * 4 * std::sqrt(512.0) * std::ldexp(1.0, -24) * 6 * kSteps;
  const std::vector<Run> runs = {
      {"1 device, SGD", 1, Optim::Sgd, false, 1, 1e-5},
      {"2 CPU workers (m-etf), SGD", 2, Optim::Sgd, false, 1, kReordered},
      {"4 CPU workers (m-etf), SGD", 4, Optim::Sgd, false, 1, kReordered},
      {"2 CPU workers (m-etf), Adam + StepLR", 2, Optim::AdamWithSchedule, false, 2, kReordered},
      // Micro-batches add each weight gradient up in 3 parts: the same
      // reordering bound.
      {"2-stage 1F1B pipeline (3 micro-batches), SGD, no batch norm", 2, Optim::Sgd, true, 1, kReordered},
  };
  bool ok = true;
  for (const Run& run : runs) {
    modelpar::Options opts;
    opts.devices = run.devices;
    if (run.pipeline) {
      opts.pipeline = modelpar::PipelineOptions{};
      opts.pipeline->microbatches = 3;
      opts.pipeline->schedule = "1f1b";
    } else if (run.devices > 1) {
      opts.placer = "m-etf";
    }
    modelpar::configure(opts);  // a new planning option drops cached plans
    modelpar::resetCounters();
    const std::vector<float> captured = train(modelpar::device(), kSteps, run.optim, !run.pipeline);
    const modelpar::Counters counters = modelpar::counters();
    const std::vector<float> eager = train(torch::kCPU, kSteps, run.optim, !run.pipeline);

    std::printf("== %s\nstep  modelpar      eager\n", run.name.c_str());
    bool same_all = true;
    for (int i = 0; i < kSteps; ++i) {
      const bool same = std::abs(captured[i] - eager[i]) <= run.rtol * std::abs(eager[i]) + 1e-7;
      same_all = same_all && same;
      std::printf("%4d  %.7f  %.7f%s\n", i, captured[i], eager[i], same ? "" : "  <-- differs");
    }
    std::printf("captures %lld, replays %lld, evictions %lld, graph breaks %lld, ops recorded %lld\n",
                static_cast<long long>(counters.captures), static_cast<long long>(counters.replays),
                static_cast<long long>(counters.evictions),
                static_cast<long long>(counters.graph_breaks),
                static_cast<long long>(counters.ops_recorded));
    if (counters.captures > run.max_captures || counters.captures + counters.replays != kSteps) {
      std::printf("expected at most %lld captures and the other steps replayed\n",
                  static_cast<long long>(run.max_captures));
      same_all = false;
    }
    const std::string placed = run.pipeline ? "2 stages on 2 devices, 3 micro-batches of 2, schedule 1f1b"
                                            : std::to_string(run.devices) + " devices";
    if (run.devices > 1 && modelpar::lastPlan().find(placed) == std::string::npos) {
      std::printf("the last plan is not placed on %d devices:\n%s", run.devices,
                  modelpar::lastPlan().c_str());
      same_all = false;
    }
    ok = ok && same_all;
  }
  std::printf("%s", modelpar::lastPlan().c_str());
  modelpar::configure(modelpar::Options{});
  std::printf(ok ? "OK: every modelpar run matches eager CPU\n" : "FAILED\n");
  return ok ? 0 : 1;
}
