// DeviceModel: links, validation, JSON profile round trip, formatBytes.
#include "passes/cost/device_model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "tests/support/expect_error.h"

namespace modelpar::passes {
namespace {

TEST(DeviceModel, UniformMachineHasOneLinkForEveryPair) {
  DeviceModel m = DeviceModel::uniform(3, DeviceSpec{}, LinkSpec{5.0, 1e9});
  EXPECT_EQ(m.numDevices(), 3);
  EXPECT_EQ(m.device(2).name, "gpu2");
  // 5 us + 1e6 bytes / 1e9 bytes/s = 5 + 1000 us.
  EXPECT_DOUBLE_EQ(m.transferUs(0, 2, 1'000'000), 1005.0);
  EXPECT_DOUBLE_EQ(m.transferUs(1, 1, 1'000'000), 0.0);
}

TEST(DeviceModel, ExplicitLinksOverrideTheDefault) {
  DeviceModel m = DeviceModel::uniform(4);
  m.setLink(0, 1, LinkSpec{1.0, 1e11});
  m.setDefaultLink(LinkSpec{20.0, 1e9});
  EXPECT_DOUBLE_EQ(m.link(1, 0).latency_us, 1.0);   // symmetric override kept
  EXPECT_DOUBLE_EQ(m.link(2, 3).latency_us, 20.0);  // default replaced
  m.setLink(2, 3, LinkSpec{3.0, 1e10}, /*symmetric=*/false);
  EXPECT_DOUBLE_EQ(m.link(2, 3).latency_us, 3.0);
  EXPECT_DOUBLE_EQ(m.link(3, 2).latency_us, 20.0);
}

TEST(DeviceModel, ProfileRoundTripsThroughJsonFile) {
  DeviceModel m = DeviceModel::fromDevices(
      {DeviceSpec{"a100", int64_t{40} << 30, 3.1e14, 1.5e12, 4.0},
       DeviceSpec{"v100", int64_t{16} << 30, 1.2e14, 9e11, 6.0}},
      LinkSpec{12.0, 1.2e10});
  m.setLink(0, 1, LinkSpec{2.5, 1.5e11}, /*symmetric=*/false);
  std::string path = (std::filesystem::temp_directory_path() / "modelpar_machine_test.json").string();
  m.save(path);
  DeviceModel back = DeviceModel::load(path);
  std::remove(path.c_str());
  EXPECT_EQ(back, m);
  EXPECT_EQ(back.device(1).name, "v100");
  EXPECT_DOUBLE_EQ(back.link(0, 1).bandwidth, 1.5e11);
  EXPECT_DOUBLE_EQ(back.link(1, 0).bandwidth, 1.2e10);
}

TEST(DeviceModel, StepOverheadRoundTripsAndIsOptionalInTheProfile) {
  DeviceModel m = DeviceModel::uniform(2);
  EXPECT_EQ(m.toJson().find("step_overhead_us"), std::string::npos);  // 0: not written
  m.setStepOverheadUs(85.5);
  DeviceModel back = DeviceModel::fromJson(m.toJson());
  EXPECT_EQ(back, m);
  EXPECT_DOUBLE_EQ(back.stepOverheadUs(), 85.5);
  try {
    m.setStepOverheadUs(-1);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("step_overhead_us=-1 is not valid"), std::string::npos)
        << e.what();
  }
  EXPECT_DOUBLE_EQ(m.stepOverheadUs(), 85.5);  // unchanged by the refused value
}

TEST(DeviceModel, HostCoresRoundTripAndAreOptionalInTheProfile) {
  DeviceModel m = DeviceModel::uniform(2);
  EXPECT_EQ(m.toJson().find("host_cores"), std::string::npos);  // 0: not written
  EXPECT_DOUBLE_EQ(m.hostCores(), 0.0);
  m.setHostCores(1.5);
  DeviceModel back = DeviceModel::fromJson(m.toJson());
  EXPECT_EQ(back, m);
  EXPECT_DOUBLE_EQ(back.hostCores(), 1.5);
  for (double bad : {0.5, -1.0}) {
    try {
      m.setHostCores(bad);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("host_cores="), std::string::npos) << e.what();
    }
  }
  EXPECT_DOUBLE_EQ(m.hostCores(), 1.5);  // unchanged by the refused values
  m.setSendOverheadUs(9.5);
  EXPECT_DOUBLE_EQ(DeviceModel::fromJson(m.toJson()).sendOverheadUs(), 9.5);
  EXPECT_THROW(m.setSendOverheadUs(-1), ConfigError);
  m.setWorkerOverheadUs(4.5);
  EXPECT_DOUBLE_EQ(DeviceModel::fromJson(m.toJson()).workerOverheadUs(), 4.5);
  EXPECT_THROW(m.setWorkerOverheadUs(std::nan("")), ConfigError);
}

TEST(DeviceModel, RejectsBadSpecsWithTheirNames) {
  DeviceSpec bad;
  bad.name = "tiny";
  bad.memory_bytes = 0;
  try {
    DeviceModel::uniform(2, bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'tiny0'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory capacity"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DeviceModel::uniform(0), ConfigError);
  EXPECT_THROW(DeviceModel::uniform(2, DeviceSpec{}, LinkSpec{-1.0, 1e9}), ConfigError);
  DeviceModel m = DeviceModel::uniform(2);
  EXPECT_THROW(m.link(0, 2), ConfigError);
  EXPECT_THROW(m.setLink(1, 1, LinkSpec{}), ConfigError);
}

TEST(DeviceModel, LoadNamesMissingMembersAndFiles) {
  try {
    DeviceModel::fromJson(R"({"devices": [{"name": "g"}], "default_link": {}})");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("memory_bytes"), std::string::npos) << e.what();
  }
  try {
    DeviceModel::load("/nonexistent/machine.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/machine.json"), std::string::npos);
  }
  nlohmann::json wrong = nlohmann::json::parse(DeviceModel::uniform(2).toJson());
  wrong["links"] = nlohmann::json::parse(
      R"([{"src": 0, "dst": 5, "latency_us": 1, "bandwidth_bytes_per_s": 1}])");
  EXPECT_THROW(DeviceModel::fromJson(wrong.dump()), ConfigError);
  // Not JSON, a member of the wrong type, a fractional byte count: each names what is wrong.
  EXPECT_NE(testing::messageOf<ConfigError>([] { DeviceModel::fromJson("{devices: "); })
                .find("not valid JSON"), std::string::npos);
  wrong = nlohmann::json::parse(DeviceModel::uniform(1).toJson());
  wrong["devices"][0]["peak_flops"] = "fast";
  EXPECT_NE(testing::messageOf<ConfigError>([&] { DeviceModel::fromJson(wrong.dump()); })
                .find("devices[0].peak_flops must be a number"), std::string::npos);
  wrong = nlohmann::json::parse(DeviceModel::uniform(1).toJson());
  wrong["devices"][0]["memory_bytes"] = 1.5;
  EXPECT_NE(testing::messageOf<ConfigError>([&] { DeviceModel::fromJson(wrong.dump()); })
                .find("devices[0].memory_bytes must be an integer"), std::string::npos);
}

TEST(FormatBytes, PicksTheLargestBinaryUnit) {
  EXPECT_EQ(formatBytes(800), "800 B");
  EXPECT_EQ(formatBytes(3 * 1024), "3.0 KiB");
  EXPECT_EQ(formatBytes(int64_t{512} << 20), "512.0 MiB");
  EXPECT_EQ(formatBytes(int64_t{14} * (int64_t{1} << 30) + (int64_t{1} << 29)), "14.5 GiB");
}

TEST(ParseBytes, ReadsBinaryAndDecimalUnitsInAnyCase) {
  EXPECT_EQ(parseBytes("16GiB"), int64_t{16} << 30);
  EXPECT_EQ(parseBytes("512 MiB"), int64_t{512} << 20);
  EXPECT_EQ(parseBytes("1.5GB"), 1500000000);
  EXPECT_EQ(parseBytes(" 4096 "), 4096);
  EXPECT_EQ(parseBytes("4096b"), 4096);
  EXPECT_EQ(parseBytes("2kib"), 2048);
  EXPECT_EQ(parseBytes("0.5 KiB"), 512);
  EXPECT_EQ(parseBytes("3TB"), int64_t{3000000000000});
}

TEST(ParseBytes, RejectsGarbageQuotingTheTextAndTheValidForms) {
  for (const char* bad : {"", "GiB", "-1GiB", "16 GiBs", "16 G", "1.2.3", "16 GiB extra", "lots",
                          "1e3", "99999999999 TiB"}) {
    try {
      parseBytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(fmt::format("'{}' is not a size", bad)), std::string::npos) << m;
      EXPECT_NE(m.find("KiB"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace modelpar::passes
