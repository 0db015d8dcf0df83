// DeviceModel: validation, link table and the JSON machine profile.
#include "passes/device_model.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

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

Json linkJson(const LinkSpec& l) {
  Json j = Json::object();
  j.set("latency_us", Json(l.latency_us));
  j.set("bandwidth_bytes_per_s", Json(l.bandwidth));
  return j;
}

LinkSpec linkFromJson(const Json& j) {
  LinkSpec l;
  l.latency_us = j.at("latency_us").number("latency_us");
  l.bandwidth = j.at("bandwidth_bytes_per_s").number("bandwidth_bytes_per_s");
  validate(l);
  return l;
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

Json DeviceModel::toJson() const {
  Json j = Json::object();
  j.set("format", Json("modelpar-machine-v1"));
  Json devs = Json::array();
  for (const DeviceSpec& d : devices_) {
    Json dj = Json::object();
    dj.set("name", Json(d.name));
    dj.set("memory_bytes", Json(d.memory_bytes));
    dj.set("peak_flops", Json(d.peak_flops));
    dj.set("memory_bandwidth_bytes_per_s", Json(d.memory_bandwidth));
    dj.set("launch_overhead_us", Json(d.launch_overhead_us));
    devs.push(std::move(dj));
  }
  j.set("devices", std::move(devs));
  j.set("default_link", linkJson(default_link_));
  Json links = Json::array();
  for (int s = 0; s < numDevices(); ++s) {
    for (int d = 0; d < numDevices(); ++d) {
      if (!explicit_[pair(s, d)]) continue;
      Json lj = linkJson(links_[pair(s, d)]);
      lj.set("src", Json(s));
      lj.set("dst", Json(d));
      links.push(std::move(lj));
    }
  }
  j.set("links", std::move(links));
  return j;
}

DeviceModel DeviceModel::fromJson(const Json& j) {
  if (const Json* f = j.find("format")) {
    MP_CHECK(f->string("format") == "modelpar-machine-v1", ConfigError,
             "modelpar device-model: unknown profile format '{}' (expected modelpar-machine-v1)",
             f->string());
  }
  std::vector<DeviceSpec> devices;
  for (const Json& dj : j.at("devices").items("devices")) {
    DeviceSpec d;
    d.name = dj.at("name").string("device name");
    d.memory_bytes = dj.at("memory_bytes").integer("memory_bytes");
    d.peak_flops = dj.at("peak_flops").number("peak_flops");
    d.memory_bandwidth =
        dj.at("memory_bandwidth_bytes_per_s").number("memory_bandwidth_bytes_per_s");
    d.launch_overhead_us = dj.at("launch_overhead_us").number("launch_overhead_us");
    devices.push_back(std::move(d));
  }
  LinkSpec def = linkFromJson(j.at("default_link"));
  DeviceModel m = fromDevices(std::move(devices), def);
  if (const Json* links = j.find("links")) {
    for (const Json& lj : links->items("links")) {
      auto src = lj.at("src").integer("link src");
      auto dst = lj.at("dst").integer("link dst");
      MP_CHECK(src >= 0 && src < m.numDevices() && dst >= 0 && dst < m.numDevices(), ConfigError,
               "modelpar device-model: link {} -> {} names a device out of range (the machine "
               "has {} devices)", src, dst, m.numDevices());
      m.setLink(static_cast<int>(src), static_cast<int>(dst), linkFromJson(lj),
                /*symmetric=*/false);
    }
  }
  return m;
}

void DeviceModel::save(const std::string& path) const {
  std::ofstream out(path);
  MP_CHECK(out.good(), ConfigError, "modelpar device-model: cannot write '{}'", path);
  out << toJson().dump(2) << "\n";
  MP_CHECK(out.good(), ConfigError, "modelpar device-model: writing '{}' failed", path);
}

DeviceModel DeviceModel::load(const std::string& path) {
  std::ifstream in(path);
  MP_CHECK(in.good(), ConfigError,
           "modelpar device-model: cannot read machine profile '{}'; run the calibration or "
           "pass a profile that exists", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return fromJson(Json::parse(ss.str()));
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
