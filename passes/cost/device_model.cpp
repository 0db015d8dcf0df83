// DeviceModel: validation, link table and the JSON machine profile.
#include "passes/cost/device_model.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

void validate(const DeviceSpec& d) {
  MP_CHECK(d.memory_bytes > 0, ConfigError,
           "modelpar device-model: device '{}' needs a memory capacity > 0, got {}", d.name,
           d.memory_bytes);
  MP_CHECK(std::isfinite(d.peak_flops) && d.peak_flops > 0, ConfigError,
           "modelpar device-model: device '{}' needs peak FLOP/s > 0, got {}", d.name,
           d.peak_flops);
  MP_CHECK(std::isfinite(d.memory_bandwidth) && d.memory_bandwidth > 0, ConfigError,
           "modelpar device-model: device '{}' needs a memory bandwidth > 0, got {}", d.name,
           d.memory_bandwidth);
  MP_CHECK(std::isfinite(d.launch_overhead_us) && d.launch_overhead_us >= 0, ConfigError,
           "modelpar device-model: device '{}' needs a launch overhead >= 0, got {}", d.name,
           d.launch_overhead_us);
}

void validate(const LinkSpec& l) {
  MP_CHECK(std::isfinite(l.latency_us) && l.latency_us >= 0, ConfigError,
           "modelpar device-model: a link needs latency_us >= 0, got {}", l.latency_us);
  MP_CHECK(std::isfinite(l.bandwidth) && l.bandwidth > 0, ConfigError,
           "modelpar device-model: a link needs a bandwidth > 0 bytes/s, got {}", l.bandwidth);
}

using Json = nlohmann::json;

Json linkJson(const LinkSpec& l) {
  return Json{{"latency_us", l.latency_us}, {"bandwidth_bytes_per_s", l.bandwidth}};
}

// The member `key` of object `j`; ConfigError naming it when absent.
const Json& member(const Json& j, std::string_view key, std::string_view where) {
  MP_CHECK(j.is_object(), ConfigError,
           "modelpar device-model: {} must be a JSON object, got {}", where, j.dump());
  auto it = j.find(key);
  MP_CHECK(it != j.end(), ConfigError, "modelpar device-model: {} has no member '{}'", where, key);
  return *it;
}

double number(const Json& j, std::string_view key, std::string_view where) {
  const Json& v = member(j, key, where);
  MP_CHECK(v.is_number(), ConfigError, "modelpar device-model: {}.{} must be a number, got {}",
           where, key, v.dump());
  return v.get<double>();
}

int64_t integer(const Json& j, std::string_view key, std::string_view where) {
  const Json& v = member(j, key, where);
  MP_CHECK(v.is_number_integer() || (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
                                     std::abs(v.get<double>()) < 9.2e18),
           ConfigError, "modelpar device-model: {}.{} must be an integer, got {}", where, key,
           v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

std::string string(const Json& j, std::string_view key, std::string_view where) {
  const Json& v = member(j, key, where);
  MP_CHECK(v.is_string(), ConfigError, "modelpar device-model: {}.{} must be a string, got {}",
           where, key, v.dump());
  return v.get<std::string>();
}

const Json& array(const Json& j, std::string_view key, std::string_view where) {
  const Json& v = member(j, key, where);
  MP_CHECK(v.is_array(), ConfigError, "modelpar device-model: {}.{} must be an array, got {}",
           where, key, v.dump());
  return v;
}

LinkSpec linkFromJson(const Json& j, std::string_view where) {
  LinkSpec l;
  l.latency_us = number(j, "latency_us", where);
  l.bandwidth = number(j, "bandwidth_bytes_per_s", where);
  validate(l);
  return l;
}

/// `us` when it is a valid cost in microseconds (finite, >= 0); else a
/// ConfigError naming the setting.
double checkedMicroseconds(const char* name, double us) {
  MP_CHECK(std::isfinite(us) && us >= 0, ConfigError,
           "modelpar device-model: {}={} is not valid; it takes a finite number of microseconds "
           ">= 0", name, us);
  return us;
}

}  // namespace

DeviceModel DeviceModel::uniform(int n, DeviceSpec device, LinkSpec link) {
  MP_CHECK(n >= 1, ConfigError, "modelpar device-model: needs at least one device, got {}", n);
  std::vector<DeviceSpec> devices(static_cast<size_t>(n), device);
  for (int d = 0; d < n; ++d) {
    devices[static_cast<size_t>(d)].name = device.name + std::to_string(d);
  }
  return fromDevices(std::move(devices), link);
}

DeviceModel DeviceModel::fromDevices(std::vector<DeviceSpec> devices, LinkSpec link) {
  MP_CHECK(!devices.empty(), ConfigError, "modelpar device-model: needs at least one device");
  for (const DeviceSpec& d : devices) validate(d);
  validate(link);
  DeviceModel m;
  size_t n = devices.size();
  m.devices_ = std::move(devices);
  m.default_link_ = link;
  m.links_.assign(n * n, link);
  m.explicit_.assign(n * n, 0);
  return m;
}

void DeviceModel::checkDevice(int d) const {
  MP_CHECK(d >= 0 && d < numDevices(), ConfigError,
           "modelpar device-model: device {} is out of range (the machine has {} devices)", d,
           numDevices());
}

const DeviceSpec& DeviceModel::device(int d) const {
  checkDevice(d);
  return devices_[static_cast<size_t>(d)];
}

void DeviceModel::setDevice(int d, DeviceSpec spec) {
  checkDevice(d);
  validate(spec);
  devices_[static_cast<size_t>(d)] = std::move(spec);
}

void DeviceModel::setDefaultLink(LinkSpec link) {
  validate(link);
  default_link_ = link;
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!explicit_[i]) links_[i] = link;
  }
}

const LinkSpec& DeviceModel::link(int src, int dst) const {
  checkDevice(src);
  checkDevice(dst);
  return links_[pair(src, dst)];
}

void DeviceModel::setLink(int src, int dst, LinkSpec link, bool symmetric) {
  checkDevice(src);
  checkDevice(dst);
  MP_CHECK(src != dst, ConfigError, "modelpar device-model: a link joins two devices, got {} -> {}",
           src, dst);
  validate(link);
  links_[pair(src, dst)] = link;
  explicit_[pair(src, dst)] = 1;
  if (symmetric) {
    links_[pair(dst, src)] = link;
    explicit_[pair(dst, src)] = 1;
  }
}

void DeviceModel::setStepOverheadUs(double us) {
  step_overhead_us_ = checkedMicroseconds("step_overhead_us", us);
}

void DeviceModel::setHostCores(double cores) {
  MP_CHECK(cores == 0 || (std::isfinite(cores) && cores >= 1), ConfigError,
           "modelpar device-model: host_cores={} is not valid; it takes 0 (every device has a "
           "core of its own) or a finite number of cores >= 1", cores);
  host_cores_ = cores;
}

void DeviceModel::setSendOverheadUs(double us) {
  send_overhead_us_ = checkedMicroseconds("send_overhead_us", us);
}

void DeviceModel::setWorkerOverheadUs(double us) {
  worker_overhead_us_ = checkedMicroseconds("worker_overhead_us", us);
}

std::string DeviceModel::toJson(int indent) const {
  Json devs = Json::array();
  for (const DeviceSpec& d : devices_) {
    devs.push_back(Json{{"name", d.name},
                        {"memory_bytes", d.memory_bytes},
                        {"peak_flops", d.peak_flops},
                        {"memory_bandwidth_bytes_per_s", d.memory_bandwidth},
                        {"launch_overhead_us", d.launch_overhead_us}});
  }
  Json links = Json::array();
  for (int s = 0; s < numDevices(); ++s) {
    for (int d = 0; d < numDevices(); ++d) {
      if (!explicit_[pair(s, d)]) continue;
      Json lj = linkJson(links_[pair(s, d)]);
      lj["src"] = s;
      lj["dst"] = d;
      links.push_back(std::move(lj));
    }
  }
  Json j{{"format", "modelpar-machine-v1"},
         {"devices", std::move(devs)},
         {"default_link", linkJson(default_link_)},
         {"links", std::move(links)}};
  if (step_overhead_us_ != 0) j["step_overhead_us"] = step_overhead_us_;  // optional member
  if (host_cores_ != 0) j["host_cores"] = host_cores_;                    // optional member
  if (send_overhead_us_ != 0) j["send_overhead_us"] = send_overhead_us_;  // optional member
  if (worker_overhead_us_ != 0) j["worker_overhead_us"] = worker_overhead_us_;  // optional
  return j.dump(indent);
}

DeviceModel DeviceModel::fromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  MP_CHECK(!j.is_discarded(), ConfigError,
           "modelpar device-model: the machine profile is not valid JSON (see "
           "passes/cost/README.md for the schema)");
  MP_CHECK(j.is_object(), ConfigError,
           "modelpar device-model: the machine profile must be a JSON object, got {}", j.dump());
  if (j.contains("format")) {
    std::string f = string(j, "format", "the profile");
    MP_CHECK(f == "modelpar-machine-v1", ConfigError,
             "modelpar device-model: unknown profile format '{}' (expected modelpar-machine-v1)", f);
  }
  std::vector<DeviceSpec> devices;
  const Json& devs = array(j, "devices", "the profile");
  for (size_t i = 0; i < devs.size(); ++i) {
    std::string where = fmt::format("devices[{}]", i);
    DeviceSpec d;
    d.name = string(devs[i], "name", where);
    d.memory_bytes = integer(devs[i], "memory_bytes", where);
    d.peak_flops = number(devs[i], "peak_flops", where);
    d.memory_bandwidth = number(devs[i], "memory_bandwidth_bytes_per_s", where);
    d.launch_overhead_us = number(devs[i], "launch_overhead_us", where);
    devices.push_back(std::move(d));
  }
  LinkSpec def = linkFromJson(member(j, "default_link", "the profile"), "default_link");
  DeviceModel m = fromDevices(std::move(devices), def);
  if (j.contains("links")) {
    const Json& links = array(j, "links", "the profile");
    for (size_t i = 0; i < links.size(); ++i) {
      std::string where = fmt::format("links[{}]", i);
      int64_t src = integer(links[i], "src", where);
      int64_t dst = integer(links[i], "dst", where);
      MP_CHECK(src >= 0 && src < m.numDevices() && dst >= 0 && dst < m.numDevices(), ConfigError,
               "modelpar device-model: link {} -> {} names a device out of range (the machine "
               "has {} devices)", src, dst, m.numDevices());
      m.setLink(static_cast<int>(src), static_cast<int>(dst), linkFromJson(links[i], where),
                /*symmetric=*/false);
    }
  }
  if (j.contains("step_overhead_us")) m.setStepOverheadUs(number(j, "step_overhead_us", "the profile"));
  if (j.contains("host_cores")) m.setHostCores(number(j, "host_cores", "the profile"));
  if (j.contains("send_overhead_us")) {
    m.setSendOverheadUs(number(j, "send_overhead_us", "the profile"));
  }
  if (j.contains("worker_overhead_us")) {
    m.setWorkerOverheadUs(number(j, "worker_overhead_us", "the profile"));
  }
  return m;
}

void DeviceModel::save(const std::string& path) const {
  std::ofstream out(path);
  MP_CHECK(out.good(), ConfigError, "modelpar device-model: cannot write '{}'", path);
  out << toJson(2) << "\n";
  MP_CHECK(out.good(), ConfigError, "modelpar device-model: writing '{}' failed", path);
}

DeviceModel DeviceModel::load(const std::string& path) {
  std::ifstream in(path);
  MP_CHECK(in.good(), ConfigError,
           "modelpar device-model: cannot read machine profile '{}'; run the calibration or "
           "pass a profile that exists", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return fromJson(ss.str());
}

std::string formatBytes(int64_t bytes) {
  auto b = static_cast<double>(bytes);
  double mag = std::fabs(b);
  if (mag >= double(int64_t{1} << 30)) return fmt::format("{:.1f} GiB", b / double(int64_t{1} << 30));
  if (mag >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  if (mag >= double(1 << 10)) return fmt::format("{:.1f} KiB", b / double(1 << 10));
  return fmt::format("{} B", bytes);
}

int64_t parseBytes(std::string_view text) {
  auto bad = [&]() {
    MP_THROW(ConfigError,
             "modelpar: '{}' is not a size; write a non-negative number of bytes with an optional "
             "unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), "
             "e.g. \"16GiB\", \"512MiB\", \"1.5GB\"",
             text);
  };
  size_t i = 0;
  auto skipSpace = [&]() {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skipSpace();
  size_t num_begin = i;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) bad();
  double number = std::strtod(std::string(text.substr(num_begin, i - num_begin)).c_str(), nullptr);
  skipSpace();
  std::string unit;
  for (; i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])); ++i) {
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  skipSpace();
  if (i != text.size()) bad();
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1.0},         {"b", 1.0},         {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40},   {"kb", 1e3},        {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    double bytes = number * scale;
    if (!(bytes < 0x1p62)) bad();
    return static_cast<int64_t>(std::llround(bytes));
  }
  bad();
  return 0;  // unreachable: bad() throws
}

}  // namespace modelpar::passes
