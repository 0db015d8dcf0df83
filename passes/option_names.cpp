// The planning options' names, values and checks (option_names.h).
#include "passes/option_names.h"

#include <algorithm>

#include "ir/check.h"

namespace modelpar::passes {
namespace {

// Values that were renamed: the old name, the new name.
constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
    {"pipedream", "balance-time-comm"},
};

}  // namespace

std::vector<OptionValues> optionValues() {
  return {{"placer", kPlacerNames},          {"schedule", kPipelineScheduleNames},
          {"partition", kPartitionMethodNames}, {"checkpoint", kPipelineCheckpointNames},
          {"batch_norm", kBatchNormModeNames},  {"loss_reduction", kLossReductionNames},
          {"strategy", kStrategyNames},       {"devices", kDeviceWordNames}};
}

std::string quotedList(std::span<const std::string_view> values) {
  std::string out;
  for (std::string_view v : values) out += fmt::format("{}'{}'", out.empty() ? "" : ", ", v);
  return out;
}

void checkOneOf(std::string_view who, std::string_view option, std::string_view value,
                std::span<const std::string_view> values) {
  if (std::find(values.begin(), values.end(), value) != values.end()) return;
  for (const auto& [old_name, new_name] : kRenamed) {
    MP_CHECK(value != old_name, ConfigError,
             "modelpar {}: {}='{}' is now called '{}' (one name per idea); {} takes one of {}",
             who, option, value, new_name, option, quotedList(values));
  }
  MP_THROW(ConfigError, "modelpar {}: {}='{}' is not valid; {} takes one of {}", who, option,
           value, option, quotedList(values));
}

void checkDevices(std::string_view who, int64_t devices) {
  MP_CHECK(devices >= 1 && devices <= kMaxDevices, ConfigError,
           "modelpar {}: devices={} is not valid; devices takes an int from 1 to {}", who,
           devices, kMaxDevices);
}

}  // namespace modelpar::passes
