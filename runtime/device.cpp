// Device maps and the device factory (device.h).
#include "runtime/device.h"

#include <c10/util/Exception.h>

#include "runtime/check.h"

namespace modelpar::runtime {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

c10::Device parseOne(std::string_view text, std::string_view spec) {
  try {
    return c10::Device(std::string(text));
  } catch (const c10::Error& e) {
    MP_RT_THROW(ConfigError, "modelpar executor: device map '", spec, "': '", text,
                "' is not a device (", e.what_without_backtrace(),
                "); use cpu-workers, cuda, cuda:K or a list like cuda:0,cuda:1");
  }
}

}  // namespace

std::string Device::describe() const {
  return c10::str("logical device ", index_, " (",
                  kind_ == DeviceKind::CpuWorker ? "cpu worker" : physical_.str(), ")");
}

DeviceMap DeviceMap::cpuWorkers(int n, int threads_per_device) {
  MP_RT_CHECK(n >= 1, ConfigError, "modelpar executor: need at least one device, got ", n);
  DeviceMap m;
  m.devices.assign(static_cast<size_t>(n), c10::Device(c10::kCPU));
  m.threads_per_device = threads_per_device;
  return m;
}

DeviceMap DeviceMap::parse(std::string_view spec, int n, int threads_per_device) {
  MP_RT_CHECK(n >= 1, ConfigError, "modelpar executor: need at least one device, got ", n);
  MP_RT_CHECK(threads_per_device >= 0, ConfigError,
              "modelpar executor: threads_per_device must be >= 0 (0 = automatic), got ",
              threads_per_device);
  const std::string_view s = trim(spec);
  if (s == "cpu-workers" || s == "cpu") return cpuWorkers(n, threads_per_device);
  DeviceMap m;
  m.threads_per_device = threads_per_device;
  if (s == "cuda") {
    for (int i = 0; i < n; ++i) m.devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    return m;
  }
  if (s.find(',') == std::string_view::npos) {
    const c10::Device d = parseOne(s, spec);
    if (d.is_cuda() && !d.has_index()) return parse("cuda", n, threads_per_device);
    m.devices.assign(static_cast<size_t>(n), d);
    return m;
  }
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    m.devices.push_back(parseOne(trim(s.substr(start, comma - start)), spec));
    start = comma + 1;
  }
  MP_RT_CHECK(m.devices.size() == static_cast<size_t>(n), ConfigError,
              "modelpar executor: device map '", spec, "' names ", m.devices.size(),
              " devices but the program has ", n);
  return m;
}

DeviceKind DeviceMap::kind() const {
  return !devices.empty() && devices.front().is_cuda() ? DeviceKind::Cuda : DeviceKind::CpuWorker;
}

std::string DeviceMap::toString() const {
  if (kind() == DeviceKind::CpuWorker) {
    return c10::str(devices.size(), " cpu-workers x ",
                    threads_per_device == 0 ? std::string("auto") : c10::str(threads_per_device),
                    " threads");
  }
  std::string s;
  for (const c10::Device& d : devices) {
    if (!s.empty()) s += ',';
    s += d.str();
  }
  return s;
}

std::vector<std::unique_ptr<Device>> createDevices(const DeviceMap& map) {
  MP_RT_CHECK(!map.devices.empty(), ConfigError, "modelpar executor: the device map is empty");
  const bool cuda = map.devices.front().is_cuda();
  for (size_t i = 0; i < map.devices.size(); ++i) {
    const c10::Device& d = map.devices[i];
    MP_RT_CHECK(d.is_cpu() || d.is_cuda(), ConfigError, "modelpar executor: logical device ", i,
                " maps to ", d.str(), "; supported are CPU workers and CUDA devices");
    MP_RT_CHECK(d.is_cuda() == cuda, ConfigError, "modelpar executor: device map ", map.toString(),
                " mixes CPU and CUDA devices; map every logical device to the same kind");
  }
  if (!cuda) return createCpuWorkerDevices(map);
  MP_RT_CHECK(cudaDevicesBuilt(), ConfigError, "modelpar executor: device map ", map.toString(),
              " needs CUDA, but this modelpar build has no CUDA support (MODELPAR_WITH_CUDA=OFF); "
              "use cpu-workers or rebuild against a CUDA torch");
  return createCudaDevices(map);
}

#ifndef MODELPAR_WITH_CUDA
bool cudaDevicesBuilt() { return false; }
int cudaDeviceCount() { return 0; }
std::vector<std::unique_ptr<Device>> createCudaDevices(const DeviceMap&) {
  MP_RT_THROW(ConfigError, "modelpar executor: built without CUDA (MODELPAR_WITH_CUDA=OFF)");
}
#endif

}  // namespace modelpar::runtime
