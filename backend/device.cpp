// The modelpar device: PrivateUse1 renamed "modelpar", with one logical
// device (index 0), its allocator, guard and hooks. The allocator, guard and
// hooks register when the library loads, and so does the name where no GPU
// is visible; where one is, the name waits for modelpar::device()
// (nameDevice(), Note [Naming the device is not free]).
#include <cstdlib>
#include <string_view>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "backend/device.h"
#include "backend/storage.h"

namespace modelpar::backend {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

void checkIndex(c10::DeviceIndex i) {
  TORCH_CHECK(i == -1 || i == 0, "modelpar: there is one modelpar device (modelpar:0); got index ", i);
}

/// One device, one stream, no events to wait for: the capture is synchronous.
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    checkIndex(d.index());
    return c10::Device(kType, 0);
  }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device d) const override { checkIndex(d.index()); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override { return defaultStream(); }
  c10::Stream getDefaultStream(c10::Device) const override { return defaultStream(); }
  c10::Stream exchangeStream(c10::Stream) const override { return defaultStream(); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}

 private:
  static c10::Stream defaultStream() { return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, 0)); }
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex i) const override { checkIndex(i); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex i) const override {
    checkIndex(i);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  // Random ops are recorded and run on the CPU: they draw from its generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kType, 0); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// Whether PyTorch has an accelerator with a device attached (CUDA, ROCm,
// XPU, MPS, ...): what naming PrivateUse1 would take over. Asks the device
// count as torch.cuda.is_available() does (modelpar's Python module asks
// that at import), and never throws (at::accelerator::deviceCount's
// contract). MODELPAR_NAME_DEVICE_AT_LOAD=0 answers as if one were: for a
// process that registers another PrivateUse1 backend, and for tests that
// stand in for a GPU machine.
bool acceleratorVisible() {
  const char* env = std::getenv("MODELPAR_NAME_DEVICE_AT_LOAD");
  if (env != nullptr && std::string_view(env) == "0") return true;
  const std::optional<c10::DeviceType> acc = at::accelerator::getAccelerator(/*checked=*/false);
  return acc.has_value() && *acc != kType && at::accelerator::deviceCount() > 0;
}

struct Register {
  Register() {
    c10::SetAllocator(kType, allocator());
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    // Note [Naming the device is not free]: named now where no GPU is
    // visible, so that `torch::Device("modelpar")` parses before any modelpar
    // function is called.
    if (!acceleratorVisible()) nameDevice();
  }
} register_device;

}  // namespace

// Note [Naming the device is not free]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Naming PrivateUse1 makes it PyTorch's one accelerator for the whole process
// (at::accelerator::getAccelerator prefers a named PrivateUse1 over CUDA), and
// from then on the autograd engine finds no stream for a CUDA node and fails
// an internal assert (engine.cpp, "opt_ready_stream && opt_parent_stream") in
// every backward over CUDA tensors, torch.compile's AOTAutograd tracing
// included: autograd::Node::stream() returns a stream only for inputs on the
// accelerator's device type. Seen on the first GPU run: loading modelpar broke
// CUDA training.
//
// The name and the accelerator cannot be had apart. In c10/core/DeviceType.cpp
// register_privateuse1_backend sets one flag, and both readers read it:
// is_privateuse1_backend_registered() (what getAccelerator checks first, in
// ATen/DeviceAccelerator.cpp) and get_privateuse1_backend(), the only way
// c10::Device's parser (c10/core/Device.cpp, parse_type) accepts a name
// outside its built-in list. Until the flag is set, `torch::Device("modelpar")`
// throws PyTorch's own "Expected one of cpu, cuda, ... device type at start
// of device string: modelpar", whose text we cannot extend.
//
// So the library names the device when it loads where no accelerator has a
// device attached (acceleratorVisible(): a CPU-only torch, or a CUDA torch on
// a machine without a GPU): there is nothing to take over, and LibTorch
// programs written as PyTorch users write device code (`torch::Device
// dev("modelpar"); model->to(dev);` before any modelpar call) work, as they
// did before the name waited. Where a GPU is visible, loading does not name
// it; modelpar::device() does, once the program asks for the modelpar device
// (include/modelpar/modelpar.h says so), and the Python module does at
// import only where no GPU is visible (modelpar.device.enable() otherwise,
// with a warning). MODELPAR_NAME_DEVICE_AT_LOAD=0 keeps loading from naming
// it anyway (another PrivateUse1 backend in the process; tests standing in
// for a GPU machine). tests/libtorch/device_name_test.cpp is the program as
// users write it.
void nameDevice() {
  static const bool named = [] {
    c10::register_privateuse1_backend("modelpar");
    return true;
  }();
  (void)named;
}

}  // namespace modelpar::backend
