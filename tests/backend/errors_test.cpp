// What the modelpar device does with what it cannot capture: data-dependent
// ops break the graph (counted, warned once, still correct) or raise in
// strict mode; mixing devices and in-place metadata changes raise.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <modelpar/modelpar.h>

#include "ir/error.h"

namespace {

/// Collects TORCH_WARN messages while alive.
class Warnings : public c10::WarningHandler {
 public:
  Warnings() : guard_(this) {}
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

/// Restores the default options when a test ends.
struct StrictMode {
  explicit StrictMode(bool strict) {
    modelpar::Options o = modelpar::options();
    o.strict = strict;
    modelpar::setOptions(o);
  }
  ~StrictMode() { modelpar::setOptions(modelpar::Options{}); }
};

at::Tensor onDevice(const at::Tensor& t) { return t.to(modelpar::device()); }

struct DataDependentCase {
  const char* op;
  at::Tensor (*run)(const at::Tensor&);
};

const DataDependentCase kDataDependent[] = {
    {"aten::nonzero", [](const at::Tensor& x) { return at::nonzero(x > 0); }},
    {"aten::_unique2", [](const at::Tensor& x) { return std::get<0>(at::_unique2(at::floor(x))); }},
    {"aten::masked_select", [](const at::Tensor& x) { return at::masked_select(x, x > 0); }},
};

TEST(BackendErrors, DataDependentOpsBreakTheGraphOnceWarnedAndStayCorrect) {
  StrictMode off(false);
  at::manual_seed(0);
  const at::Tensor x = at::randn({5, 4}) * 3;
  for (const DataDependentCase& c : kDataDependent) {
    Warnings warnings;
    const int64_t before = modelpar::counters().graph_breaks;
    at::Tensor m = onDevice(x) * 1.0;  // pending in a trace when the op comes
    at::Tensor got = c.run(m);
    EXPECT_EQ(got.device(), modelpar::device()) << c.op;
    EXPECT_TRUE(at::equal((got * 1).to(at::kCPU), c.run(x))) << c.op;
    EXPECT_EQ(modelpar::counters().graph_breaks, before + 1) << c.op;
    ASSERT_EQ(warnings.messages.size(), 1u) << c.op;
    EXPECT_NE(warnings.messages[0].find(c.op), std::string::npos) << warnings.messages[0];
    EXPECT_NE(warnings.messages[0].find("graph break"), std::string::npos) << warnings.messages[0];
    c.run(m);  // the warning is given once per op
    EXPECT_EQ(warnings.messages.size(), 1u) << c.op;
  }
}

TEST(BackendErrors, DataDependentOpsRaiseInStrictMode) {
  StrictMode on(true);
  const at::Tensor x = onDevice(at::randn({5, 4}));
  for (const DataDependentCase& c : kDataDependent) {
    try {
      c.run(x);
      FAIL() << c.op << " should raise in strict mode";
    } catch (const modelpar::UnsupportedOpError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.op), std::string::npos) << msg;
      EXPECT_NE(msg.find("depends on the data"), std::string::npos) << msg;
      EXPECT_NE(msg.find("strict"), std::string::npos) << msg;
    }
  }
}

TEST(BackendErrors, MixingDevicesNamesTheOpAndBothDevices) {
  const at::Tensor m = onDevice(at::randn({2, 3}));
  const at::Tensor cpu = at::randn({2, 3});
  struct Case {
    const char* op;
    std::function<void()> run;
  } cases[] = {
      {"aten::add.Tensor", [&] { (void)(m + cpu); }},
      {"aten::mm", [&] { (void)at::mm(cpu, m.t()); }},
      {"aten::cat", [&] { (void)at::cat({m, cpu}); }},
      {"aten::where.self", [&] { (void)at::where(cpu > 0, m, m); }},
  };
  for (const Case& c : cases) {
    try {
      c.run();
      FAIL() << c.op << " should reject tensors on two devices";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find(c.op), std::string::npos) << msg;
      EXPECT_NE(msg.find("modelpar:0"), std::string::npos) << msg;
      EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
    }
  }
}

TEST(BackendErrors, CpuScalarsMayJoinModelparTensors) {
  const at::Tensor x = at::randn({2, 3});
  const at::Tensor s = at::scalar_tensor(2.5);
  EXPECT_TRUE(at::allclose((onDevice(x) * s).to(at::kCPU), x * s));
}

TEST(BackendErrors, ResizingAModelparTensorIsRejected) {
  at::Tensor m = onDevice(at::randn({2, 3}));
  try {
    m.resize_({7});
    FAIL() << "resize_ should be rejected";
  } catch (const modelpar::UnsupportedOpError& e) {
    EXPECT_NE(std::string(e.what()).find("resize_"), std::string::npos) << e.what();
  }
}

}  // namespace
