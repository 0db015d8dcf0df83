// Note [Reproducible random ops over workers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A random op (dropout, bernoulli, rand_like, ...) draws from its device's
// default generator, one for all the CPU worker threads (one per GPU on
// CUDA devices). Where the program orders every two random ops (a placement
// whose dropouts form a chain through the devices), the workers draw in that
// order, eager's order when it is eager's chain, and the same every run. But
// a pipeline's stages run their micro-batches' dropouts at once, and then
// which worker reaches the generator first decides every mask: GPT-2 with
// its dropout of 0.1 in a 1F1B pipeline of 2 stages, three runs after
// torch.manual_seed(0), ended their third step at losses 4.18587, 4.18699
// and 4.18724. Such a program (randomOpsOrdered false) draws a step seed
// from the default CPU generator at each step, and each random op reseeds
// its generator from that seed and its node before it runs, with the other
// workers' random ops held out until it has: what each op draws is then a
// function of torch.manual_seed, the step and the op alone. After the step
// the generators are put back as the step seed's draw left them, so the
// steps after draw new seeds, as eager's draws move on.
#include "runtime/random_seeding.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include "ir/random_ops.h"

namespace modelpar::runtime {

bool randomOpsOrdered(const ir::Program& p) {
  const ir::Graph& g = p.graph();
  const int nd = p.numDevices();
  std::vector<size_t> offset(static_cast<size_t>(nd) + 1, 0);
  for (int d = 0; d < nd; ++d) offset[static_cast<size_t>(d) + 1] = offset[static_cast<size_t>(d)] + p.schedule(d).size();
  const size_t n = offset.back();
  std::vector<size_t> random;  // global ids of random runs
  std::vector<int> device_of(n);
  std::map<std::tuple<ir::ValueId, int, int>, size_t> send_of;  // (value, from, to) -> id
  for (int d = 0; d < nd; ++d) {
    const auto& s = p.schedule(d);
    for (size_t i = 0; i < s.size(); ++i) {
      const size_t id = offset[static_cast<size_t>(d)] + i;
      device_of[id] = d;
      if (s[i].kind == ir::Instruction::Kind::Run && ir::isRandom(g.node(s[i].node))) {
        random.push_back(id);
      }
      if (s[i].kind == ir::Instruction::Kind::Send) send_of[{s[i].value, d, s[i].peer}] = id;
    }
  }
  if (random.size() < 2) return true;
  if (std::all_of(random.begin(), random.end(),
                  [&](size_t r) { return device_of[r] == device_of[random[0]]; })) {
    return true;
  }
  // Successors: the next instruction on the device, and a send's recv.
  std::vector<std::vector<size_t>> next(n);
  std::vector<int> indegree(n, 0);
  auto edge = [&](size_t a, size_t b) {
    next[a].push_back(b);
    ++indegree[b];
  };
  for (int d = 0; d < nd; ++d) {
    const auto& s = p.schedule(d);
    for (size_t i = 0; i < s.size(); ++i) {
      const size_t id = offset[static_cast<size_t>(d)] + i;
      if (i + 1 < s.size()) edge(id, id + 1);
      if (s[i].kind != ir::Instruction::Kind::Recv) continue;
      auto it = send_of.find({s[i].value, s[i].peer, d});
      if (it != send_of.end()) edge(it->second, id);
    }
  }
  // A topological order (Kahn); random ops by their place in it. They are
  // totally ordered iff each reaches the next.
  std::vector<size_t> position(n, n);
  std::deque<size_t> ready;
  for (size_t id = 0; id < n; ++id) {
    if (indegree[id] == 0) ready.push_back(id);
  }
  for (size_t k = 0; !ready.empty(); ++k) {
    const size_t id = ready.front();
    ready.pop_front();
    position[id] = k;
    for (size_t b : next[id]) {
      if (--indegree[b] == 0) ready.push_back(b);
    }
  }
  std::sort(random.begin(), random.end(), [&](size_t a, size_t b) { return position[a] < position[b]; });
  std::vector<char> seen(n, 0);
  for (size_t k = 0; k + 1 < random.size(); ++k) {
    const size_t from = random[k], to = random[k + 1];
    std::fill(seen.begin(), seen.end(), 0);
    std::vector<size_t> stack{from};
    bool reached = false;
    while (!stack.empty() && !reached) {
      const size_t id = stack.back();
      stack.pop_back();
      for (size_t b : next[id]) {
        if (b == to) reached = true;
        if (seen[b] || position[b] > position[to]) continue;  // past `to`: cannot reach it
        seen[b] = 1;
        stack.push_back(b);
      }
    }
    if (!reached) return false;
  }
  return true;
}

namespace {

// SplitMix64's finaliser: distinct seeds for neighbouring node ids.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void RandomSeeding::beginStep(const std::vector<c10::Device>& devices) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    step_seed_ = cpu.get<at::CPUGeneratorImpl>()->random64();
  }
  saved_.clear();
  for (const c10::Device& d : devices) {
    at::Generator gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved_.emplace_back(gen, gen.get_state());
  }
}

std::unique_lock<std::mutex> RandomSeeding::seed(ir::NodeId node, c10::Device device) {
  std::unique_lock<std::mutex> held(mu_);
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(mix(step_seed_ ^ mix(static_cast<uint64_t>(node))));
  return held;
}

void RandomSeeding::endStep() {
  for (auto& [gen, state] : saved_) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
  saved_.clear();
}

}  // namespace modelpar::runtime
