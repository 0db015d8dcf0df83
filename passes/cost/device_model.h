// The machine a plan targets: logical devices (memory, FLOP/s, memory
// bandwidth, kernel launch overhead) and the link between every device pair
// (latency + bytes / bandwidth, DistIR's Topology and Baechi's linear
// communication cost, algorithms.md §1.3 and §3.2). Saved as a JSON profile.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>


namespace modelpar::passes {

/// One logical device. Defaults are DistIR's (algorithms.md §3.2) with a
/// 16 GiB memory.
struct DeviceSpec {
  std::string name = "gpu";
  int64_t memory_bytes = int64_t{16} << 30;
  double peak_flops = 1.4e13;        ///< FLOP/s
  double memory_bandwidth = 9.0e11;  ///< bytes/s
  double launch_overhead_us = 10.0;  ///< added to every kernel
  bool operator==(const DeviceSpec&) const = default;
};

/// A directed link: a transfer of b bytes takes latency_us + b / bandwidth.
struct LinkSpec {
  double latency_us = 10.0;
  double bandwidth = 1.0e10;  ///< bytes/s
  /// Transfer time in microseconds.
  double timeUs(int64_t bytes) const {
    return latency_us + static_cast<double>(bytes) / bandwidth * 1e6;
  }
  bool operator==(const LinkSpec&) const = default;
};

/// Devices 0..N-1 and a link per ordered pair. Pairs without an explicit link
/// use the default link (uniform machine).
///
/// Example:
///   DeviceModel m = DeviceModel::uniform(4, DeviceSpec{}, LinkSpec{5.0, 2.5e10});
///   m.setLink(0, 1, LinkSpec{2.0, 1.5e11});      // NVLink between 0 and 1
///   double t = m.transferUs(0, 1, 1 << 20);       // 2 + 2^20 / 1.5e11 s
///   m.save("machine.json");
class DeviceModel {
 public:
  DeviceModel() = default;
  /// n identical devices joined by identical links. Throws ConfigError unless
  /// n >= 1 and the specs are valid.
  static DeviceModel uniform(int n, DeviceSpec device = {}, LinkSpec link = {});
  /// Devices with their own specs, joined by `link`.
  static DeviceModel fromDevices(std::vector<DeviceSpec> devices, LinkSpec link = {});

  int numDevices() const { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceSpec>& devices() const { return devices_; }
  /// Throws ConfigError for a device out of range.
  const DeviceSpec& device(int d) const;
  /// Sets a device's spec (validated).
  void setDevice(int d, DeviceSpec spec);

  const LinkSpec& defaultLink() const { return default_link_; }
  /// Replaces the link of every pair that has no explicit link.
  void setDefaultLink(LinkSpec link);
  /// A fixed cost of every step, whatever runs in it: the runtime waking its
  /// device workers and collecting their results (CPU workers: tens of
  /// microseconds; modelpar/profiles/calibration.py measures it). simulate() adds it
  /// to the step time. 0 by default.
  double stepOverheadUs() const { return step_overhead_us_; }
  /// Throws ConfigError unless 0 <= us < infinity.
  void setStepOverheadUs(double us);
  /// The cores the devices' compute shares (Note [Shared host cores] in
  /// passes/lower/simulate.cpp): CPU worker devices are threads of one
  /// process, and when other work holds some of the machine's cores, n
  /// workers get fewer than n. 0 (the default): every device computes on
  /// a core of its own.
  double hostCores() const { return host_cores_; }
  /// Throws ConfigError unless cores is 0 or a finite number >= 1.
  void setHostCores(double cores);
  /// What issuing a send costs the sending device's compute stream (CPU
  /// workers: handing the value to the copy thread and waking the receiver,
  /// about 10 us; modelpar/profiles/calibration.py measures it). simulate() adds it
  /// to the run before each send. 0 by default.
  double sendOverheadUs() const { return send_overhead_us_; }
  /// Throws ConfigError unless 0 <= us < infinity.
  void setSendOverheadUs(double us);
  /// What each device of a program beyond the first adds to the step's
  /// fixed cost (CPU workers: waking one more worker and waiting for it;
  /// modelpar/profiles/calibration.py measures it). simulate() adds it (devices - 1)
  /// times. 0 by default.
  double workerOverheadUs() const { return worker_overhead_us_; }
  /// Throws ConfigError unless 0 <= us < infinity.
  void setWorkerOverheadUs(double us);
  /// The link src -> dst (src != dst).
  const LinkSpec& link(int src, int dst) const;
  /// Sets the link src -> dst, and dst -> src when `symmetric`.
  void setLink(int src, int dst, LinkSpec link, bool symmetric = true);
  /// Time to move `bytes` from src to dst; 0 when src == dst.
  double transferUs(int src, int dst, int64_t bytes) const {
    if (src == dst) return 0.0;
    return link(src, dst).timeUs(bytes);
  }

  /// The JSON profile text (schema in passes/cost/README.md), indented by
  /// `indent` spaces (compact when < 0). fromJson throws ConfigError for
  /// text that is not JSON, naming the member that is missing or wrong.
  std::string toJson(int indent = 2) const;
  static DeviceModel fromJson(std::string_view text);
  /// Writes / reads a profile file. Throws ConfigError when the file cannot
  /// be opened.
  void save(const std::string& path) const;
  static DeviceModel load(const std::string& path);

  bool operator==(const DeviceModel&) const = default;

 private:
  size_t pair(int src, int dst) const {
    return static_cast<size_t>(src) * devices_.size() + static_cast<size_t>(dst);
  }
  void checkDevice(int d) const;

  std::vector<DeviceSpec> devices_;
  LinkSpec default_link_;
  double step_overhead_us_ = 0.0;
  double host_cores_ = 0.0;
  double send_overhead_us_ = 0.0;
  double worker_overhead_us_ = 0.0;
  std::vector<LinkSpec> links_;      // N*N, row = source
  std::vector<uint8_t> explicit_;    // N*N: 1 where setLink set the link
};

/// Bytes for people: "14.2 GiB", "512.0 MiB", "3.0 KiB", "800 B".
std::string formatBytes(int64_t bytes);

/// Reads a size: a number (decimals allowed) and an optional unit, case and
/// spaces ignored: "16GiB", "512 MiB", "1.5GB", "4096", "4096B". Binary units
/// KiB..TiB are powers of 1024, decimal KB..TB powers of 1000. Throws
/// ConfigError quoting the text and the accepted forms on anything else,
/// including negative sizes.
int64_t parseBytes(std::string_view text);

}  // namespace modelpar::passes
