// Host overhead per operator of the modelpar runtime against direct ATen
// calls, on tiny tensors (where launch and bookkeeping dominate). One chain
// of kOps element-wise ops (add, mul, relu, repeated) on a small f32 tensor,
// run four ways:
//   direct   at::_ops::<op>::call (the unboxed C++ API, through the dispatcher)
//   boxed    OperatorHandle::callBoxed with handles resolved once (the floor
//            of any boxed interpreter)
//   interp   runtime::Interpreter::run of the same chain as an ir::Graph
// Prints ns per op (median of repeats). Build: cmake --build BUILD --target
// modelpar_bench_overhead; run: BUILD/bench/modelpar_bench_overhead [numel].
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>

#include "ir/ir.h"
#include "runtime/interpreter.h"

namespace {

constexpr int kOps = 999;  // a multiple of 3: add, mul, relu
constexpr int kRepeats = 31;

template <typename F>
double medianNsPerOp(F&& run) {
  std::vector<double> ns;
  run();  // warm-up
  for (int r = 0; r < kRepeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kOps);
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

std::string chainIr(int64_t numel) {
  std::string t = "f32[" + std::to_string(numel) + "]";
  std::string s = "graph @chain(%x: " + t + " input, %w: " + t + " input) {\n";
  std::string prev = "%x";
  for (int i = 0; i < kOps; ++i) {
    std::string v = "%v" + std::to_string(i);
    const char* op = i % 3 == 0 ? "aten::add.Tensor(" : i % 3 == 1 ? "aten::mul.Tensor(" : "aten::relu(";
    s += "  " + v + ": " + t + " = " + op + prev + (i % 3 == 2 ? ")\n" : ", %w)\n");
    prev = v;
  }
  return s + "  return " + prev + "\n}\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace modelpar;
  const int64_t numel = argc > 1 ? std::atoll(argv[1]) : 1;
  at::Tensor x = at::randn({numel});
  at::Tensor w = at::randn({numel});

  const double direct = medianNsPerOp([&] {
    at::Tensor y = x;
    for (int i = 0; i < kOps; i += 3) {
      y = at::_ops::add_Tensor::call(y, w, 1);
      y = at::_ops::mul_Tensor::call(y, w);
      y = at::_ops::relu::call(y);
    }
  });

  auto& d = c10::Dispatcher::singleton();
  const c10::OperatorHandle add = d.findSchemaOrThrow("aten::add", "Tensor");
  const c10::OperatorHandle mul = d.findSchemaOrThrow("aten::mul", "Tensor");
  const c10::OperatorHandle relu = d.findSchemaOrThrow("aten::relu", "");
  const double boxed = medianNsPerOp([&] {
    c10::IValue y = x;
    std::vector<c10::IValue> stack;
    for (int i = 0; i < kOps; i += 3) {
      stack = {y, w, c10::Scalar(1)};
      add.callBoxed(stack);
      stack = {stack[0], w};
      mul.callBoxed(stack);
      stack = {stack[0]};
      relu.callBoxed(stack);
      y = stack[0];
    }
  });

  const runtime::Interpreter interp(ir::parseGraph(chainIr(numel)));
  const double interpreted = medianNsPerOp([&] { interp.run({x, w}); });

  std::printf("| tensor numel | ops | direct at::_ops (ns/op) | boxed callBoxed (ns/op) | "
              "modelpar Interpreter (ns/op) | interpreter overhead vs direct (ns/op) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| %lld | %d | %.0f | %.0f | %.0f | %+.0f |\n", static_cast<long long>(numel), kOps,
              direct, boxed, interpreted, interpreted - direct);
  return 0;
}
