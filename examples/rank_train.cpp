// Trains a four-layer MLP (examples/ir/mlp4_grads_symbolic.txt) for a few SGD
// steps as N processes, one per logical device, from LibTorch alone: the
// program makes its own c10d group (a TCPStore, rank 0 its server, and a
// ProcessGroupGloo on it), plans the step (a 1F1B pipeline of N stages by
// default, GPipe, or an op placement by m-TOPO, m-ETF or m-SCT), runs its
// rank's part with runtime::RankExecutor, and updates the parameters this
// rank owns from the gradients that come home to it. Each rank also runs the
// whole step in one piece (runtime::Interpreter, the plain single-device
// graph) and checks the loss and its own gradients against it every step; it
// exits non-zero on a mismatch or an error.
//
// Launch N copies, by hand or with torchrun:
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 build/examples/rank_train &
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 build/examples/rank_train
//   torchrun --nproc-per-node 4 --no-python build/examples/rank_train --plan gpipe
// Options (each overrides its environment variable): --rank R (RANK),
// --world-size N (WORLD_SIZE), --master-addr A (MASTER_ADDR, default
// 127.0.0.1), --master-port P (MASTER_PORT, default 29500), --plan
// 1f1b|gpipe|m-topo|m-etf|m-sct (default 1f1b), --steps S (default 5).
// Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) every
// rank is a store client. m-ETF and m-SCT keep this small step on one
// device (a transfer costs more than it saves); m-TOPO balances memory and
// splits it.
//
// Built only where Gloo's headers are found (Debian: libgloo-dev): the torch
// wheel ships libtorch_cpu with Gloo inside, but not the headers that
// torch/csrc/distributed/c10d/ProcessGroupGloo.hpp includes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/plan_pipeline.h"
#include "passes/plan_placement.h"
#include "runtime/interpreter.h"
#include "runtime/rank_executor.h"

namespace {

using c10::IValue;
using modelpar::ConfigError;
using modelpar::ir::Graph;
using modelpar::ir::InputRole;
using modelpar::ir::Program;

constexpr int64_t kBatch = 16;
constexpr int kMicrobatches = 4;
constexpr double kLearningRate = 0.2;
// Bounds the whole run: the store waits this long for every rank, Gloo for a
// collective, the executor for each transfer (a dead peer is named within it).
constexpr std::chrono::seconds kTimeout{15};

struct Args {
  int rank = -1;
  int world = -1;
  std::string addr = "127.0.0.1";
  int port = 29500;
  std::string plan = "1f1b";
  int steps = 5;
  bool agent_store = false;
};

int toInt(const std::string& flag, const std::string& s) {
  size_t end = 0;
  int v = 0;
  try {
    v = std::stoi(s, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end == 0 || end != s.size()) throw ConfigError("rank_train: " + flag + " needs an integer, got '" + s + "'");
  return v;
}

Args parseArgs(int argc, char** argv) {
  Args a;
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::optional<std::string>(v) : std::nullopt;
  };
  if (auto v = env("RANK")) a.rank = toInt("RANK", *v);
  if (auto v = env("WORLD_SIZE")) a.world = toInt("WORLD_SIZE", *v);
  if (auto v = env("MASTER_ADDR")) a.addr = *v;
  if (auto v = env("MASTER_PORT")) a.port = toInt("MASTER_PORT", *v);
  a.agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw ConfigError("rank_train: " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--rank") a.rank = toInt(flag, value);
    else if (flag == "--world-size") a.world = toInt(flag, value);
    else if (flag == "--master-addr") a.addr = value;
    else if (flag == "--master-port") a.port = toInt(flag, value);
    else if (flag == "--plan") a.plan = value;
    else if (flag == "--steps") a.steps = toInt(flag, value);
    else throw ConfigError("rank_train: unknown option " + flag);
  }
  if (a.world < 1 || a.rank < 0 || a.rank >= a.world) {
    throw ConfigError("rank_train: need 0 <= rank < world size (--rank/RANK, --world-size/WORLD_SIZE), got rank " +
                      std::to_string(a.rank) + " of " + std::to_string(a.world));
  }
  if (a.port <= 0 || a.port > 65535) throw ConfigError("rank_train: bad port " + std::to_string(a.port));
  if (a.plan != "1f1b" && a.plan != "gpipe" && a.plan != "m-topo" && a.plan != "m-etf" && a.plan != "m-sct") {
    throw ConfigError("rank_train: --plan is one of 1f1b, gpipe, m-topo, m-etf, m-sct; got '" + a.plan + "'");
  }
  if (a.steps < 1) throw ConfigError("rank_train: --steps must be >= 1");
  return a;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("rank_train: cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The step's contract (mlp4_grads_symbolic.txt): inputs x [B, n] and
/// y [B, m], then params; outputs the loss, then one gradient per param,
/// shaped as its param. Returns the params' input indices.
std::vector<size_t> checkStepGraph(const Graph& g) {
  std::vector<size_t> params;
  for (size_t k = 0; k < g.inputs().size(); ++k) {
    if (g.inputs()[k].role == InputRole::Parameter) params.push_back(k);
  }
  auto batched = [&](size_t k) {
    const std::vector<modelpar::ir::Dim>& d = g.value(g.inputs()[k].value).type.shape;
    return d.size() == 2 && d[0].symbol == "B" && d[1].isStatic();
  };
  const bool ok = g.inputs().size() == params.size() + 2 && g.outputs().size() == params.size() + 1 &&
                  (params.empty() || params.front() == 2) && batched(0) && batched(1);
  for (size_t j = 0; ok && j < params.size(); ++j) {
    if (!(g.value(g.outputs()[j + 1]).type == g.value(g.inputs()[params[j]].value).type)) {
      throw ConfigError("rank_train: output " + std::to_string(j + 1) + " of @" + g.name() +
                        " should be the gradient of param %" + g.value(g.inputs()[params[j]].value).name);
    }
  }
  if (!ok) {
    throw ConfigError("rank_train: @" + g.name() + " should take x [B, n], y [B, m], then params, and "
                      "return the loss, then one gradient per param");
  }
  return params;
}

Program plan(const Graph& step, const Args& a) {
  if (a.plan.rfind("m-", 0) == 0) {
    modelpar::passes::PlacementOptions o;
    o.devices = a.world;
    o.placer = a.plan;
    o.cost_options.symbol_sizes = {{"B", kBatch}};
    return modelpar::passes::planPlacement(step, o).program;
  }
  modelpar::passes::PipelinePlanOptions o;
  o.devices = a.world;
  o.microbatches = kMicrobatches;
  o.batch_size = kBatch;
  o.schedule = a.plan;
  return modelpar::passes::planPipeline(step, o).program;
}

/// Graph input k drawn from `seed` at its type's sizes (the batch symbol
/// bound to kBatch), divided by sqrt(its first static size) when it is a
/// weight (1/sqrt(fan_in)). Every rank draws the same numbers.
at::Tensor draw(const Graph& g, size_t k, uint64_t seed) {
  std::vector<int64_t> sizes;
  for (const auto& d : g.value(g.inputs()[k].value).type.shape) sizes.push_back(d.isStatic() ? d.size : kBatch);
  at::Tensor t = at::randn(sizes, at::detail::createCPUGenerator(seed));
  if (g.inputs()[k].role == InputRole::Parameter) t.div_(std::sqrt(static_cast<double>(sizes.front())));
  return t;
}

/// The batch every step trains on (one batch: the loss falls step by step):
/// x random, y = x @ teacher, a fixed random linear map the MLP learns.
std::pair<at::Tensor, at::Tensor> batch(const Graph& g) {
  const at::Tensor x = draw(g, 0, 1000);
  const int64_t out = g.value(g.inputs()[1].value).type.shape.at(1).size;
  const at::Tensor teacher = at::randn({x.size(1), out}, at::detail::createCPUGenerator(7));
  return {x, x.mm(teacher).div_(std::sqrt(static_cast<double>(x.size(1))))};
}

/// max |got - want| / max |want|: a gradient's elements near zero lose
/// relative precision to cancellation, the tensor as a whole does not.
double relativeError(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got - want).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

/// The store every rank meets at: rank 0 serves it (unless torchrun's agent
/// does), under a prefix of our own, as torch.distributed's default group
/// has one (under torchrun the agent shares the store).
c10::intrusive_ptr<c10d::Store> makeStore(const Args& a) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(a.port);
  so.isServer = a.rank == 0 && !a.agent_store;
  so.numWorkers = a.world;
  so.timeout = kTimeout;
  return c10::make_intrusive<c10d::PrefixStore>("modelpar_rank_train/",
                                                c10::make_intrusive<c10d::TCPStore>(a.addr, so));
}

/// A ProcessGroup whose CPU backend is Gloo: what
/// torch.distributed.init_process_group("gloo") builds, made in C++.
c10::intrusive_ptr<c10d::ProcessGroup> makeGlooGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const Args& a) {
  auto go = c10d::ProcessGroupGloo::Options::create(kTimeout);
  const bool loopback = a.addr == "localhost" || a.addr.rfind("127.", 0) == 0;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  go->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                        : ifname != nullptr ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                            : c10d::ProcessGroupGloo::createDefaultDevice());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, a.rank, a.world, go);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, a.rank, a.world);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return pg;
}

/// RankExecutor's contract: every rank runs the same Program. Each rank
/// publishes a hash of its printed plan in the store and compares all.
void checkSamePlan(c10d::Store& store, const Program& p, const Args& a) {
  const std::string mine = std::to_string(std::hash<std::string>{}(modelpar::ir::print(p)));
  store.set("plan/" + std::to_string(a.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  for (int r = 0; r < a.world; ++r) {
    const std::vector<uint8_t> theirs = store.get("plan/" + std::to_string(r));
    if (std::string(theirs.begin(), theirs.end()) != mine) {
      throw ConfigError("rank_train: rank " + std::to_string(r) + " planned another program than rank " +
                        std::to_string(a.rank) + " (same --plan and world size everywhere?)");
    }
  }
}

int train(const Args& a) {
  const Graph step = modelpar::ir::parseGraph(readFile(MODELPAR_EXAMPLES_DIR "/ir/mlp4_grads_symbolic.txt"));
  const std::vector<size_t> params = checkStepGraph(step);
  const Program program = plan(step, a);
  const Graph& planned = program.graph();

  const c10::intrusive_ptr<c10d::Store> store = makeStore(a);
  checkSamePlan(*store, program, a);
  const c10::intrusive_ptr<c10d::ProcessGroup> group = makeGlooGroup(store, a);

  // Each gradient goes home to its param's rank; the loss to every rank.
  modelpar::runtime::RankExecutorOptions eo;
  eo.timeout = kTimeout;
  eo.replicated_outputs = {0};
  std::vector<int> home(params.size());
  for (size_t j = 0; j < params.size(); ++j) {
    home[j] = planned.inputs()[params[j]].device.value_or(0);
    eo.output_homes.emplace_back(j + 1, home[j]);
  }
  modelpar::runtime::RankExecutor executor(program, group, eo);
  const modelpar::runtime::Interpreter reference(step);

  // The reference keeps every param; this rank only those it owns (the
  // others are placeholders the executor does not read).
  std::vector<IValue> ref_in(step.inputs().size()), in(step.inputs().size());
  std::string owned;
  for (size_t j = 0; j < params.size(); ++j) {
    ref_in[params[j]] = draw(step, params[j], 1 + j);
    const bool mine = home[j] == a.rank;
    in[params[j]] = mine ? ref_in[params[j]].toTensor().clone() : at::empty({0});
    if (mine) owned += " %" + step.value(step.inputs()[params[j]].value).name;
  }
  std::tie(ref_in[0], ref_in[1]) = batch(step);
  in[0] = ref_in[0];
  in[1] = ref_in[1];
  std::printf("rank %d of %d: plan %s, %zu instructions, owns%s\n", a.rank, a.world, a.plan.c_str(),
              program.schedule(a.rank).size(), owned.empty() ? " nothing" : owned.c_str());

  // Tolerance: a pipeline's micro-batches add the fp32 sums of a matmul in
  // another order than the one-piece step (a weight gradient in 4 parts; a
  // placed step runs the one-piece kernels and is usually equal); per
  // reduction of length n that moves a result by at most about
  // 2 * 4 * sqrt(n) * 2^-24 relative (tests/python/tolerances.py), with
  // n <= 64 here, 11 matmuls in sequence (4 forward, 7 backward), and the
  // difference carried on by the updates over the steps.
  const double tol = 2 * 4 * std::sqrt(64.0) * std::ldexp(1.0, -24) * 11 * a.steps;
  bool ok = true;
  for (int s = 0; s < a.steps; ++s) {
    const std::vector<IValue> want = reference.run(ref_in);
    const std::vector<IValue> got = executor.run(in);
    const float loss = got[0].toTensor().item<float>();
    const float want_loss = want[0].toTensor().item<float>();
    double worst = relativeError(got[0].toTensor(), want[0].toTensor());
    for (size_t j = 0; j < params.size(); ++j) {
      const at::Tensor ref_w = ref_in[params[j]].toTensor();
      ref_w.sub_(want[j + 1].toTensor(), kLearningRate);
      if (home[j] != a.rank) continue;
      if (!got[j + 1].isTensor()) {
        throw std::runtime_error("rank_train: the gradient of %" + step.value(step.inputs()[params[j]].value).name +
                                 " did not come home to rank " + std::to_string(a.rank));
      }
      worst = std::max(worst, relativeError(got[j + 1].toTensor(), want[j + 1].toTensor()));
      in[params[j]].toTensor().sub_(got[j + 1].toTensor(), kLearningRate);
    }
    const bool same = worst <= tol;
    ok = ok && same;
    std::printf("rank %d step %d: loss %.7f, one process %.7f, worst relative error %.2e (tolerance %.1e)%s\n",
                a.rank, s, loss, want_loss, worst, tol, same ? "" : "  <-- differs");
  }
  // No rank leaves (and rank 0 takes the store down) while another still talks.
  group->barrier()->wait(kTimeout);
  std::printf("rank %d: %s\n", a.rank, ok ? "OK, equal to the one-process step" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parseArgs(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    return train(a);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, e.what());
  }
  return 1;
}
