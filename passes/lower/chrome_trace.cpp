// Chrome trace writer: "X" events for runs and transfers, "M" metadata for
// names, "C" counters for memory (sampled at run starts, program order).
#include "passes/lower/chrome_trace.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "ir/check.h"
#include "passes/lower/liveness.h"

namespace modelpar::passes {
namespace {

// Appends `s` as a JSON string literal (quoted, escaped).
void appendJsonString(std::string& out, std::string_view s) {
  out += nlohmann::json(std::string(s)).dump();
}

constexpr int kComputeTrack = 0, kSendTrack = 1, kRecvTrack = 2;

void meta(std::string& out, const char* what, int pid, int tid, std::string_view name) {
  out += fmt::format(R"({{"name":"{}","ph":"M","pid":{},"tid":{},"args":{{"name":)", what, pid, tid);
  appendJsonString(out, name);
  out += "}},\n";
}

void span(std::string& out, std::string_view name, std::string_view cat, int pid, int tid,
          double ts, double dur, std::string_view args) {
  out += R"({"name":)";
  appendJsonString(out, name);
  out += fmt::format(R"(,"cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{{}}}}},)",
                     cat, pid, tid, ts, dur, args);
  out += "\n";
}

}  // namespace

std::string toChromeTrace(const ir::Program& p, const SimulationReport& report) {
  MP_CHECK(report.start_us.size() == static_cast<size_t>(p.numDevices()), ConfigError,
           "modelpar chrome-trace: the report has no timeline; simulate with record_timeline");
  const ir::Graph& g = p.graph();
  std::vector<DeviceLiveness> live = analyzeLiveness(p);
  std::string out = "{\"traceEvents\":[\n";
  for (int d = 0; d < p.numDevices(); ++d) {
    meta(out, "process_name", d, 0, fmt::format("device {}", d));
    meta(out, "thread_name", d, kComputeTrack, "compute");
    meta(out, "thread_name", d, kSendTrack, "send");
    meta(out, "thread_name", d, kRecvTrack, "recv");
    const auto& sched = p.schedule(d);
    const auto& start = report.start_us[static_cast<size_t>(d)];
    const auto& end = report.end_us[static_cast<size_t>(d)];
    const DeviceLiveness& L = live[static_cast<size_t>(d)];
    int64_t cur = L.persistent_bytes + L.start_bytes;
    size_t k = 0;
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& inst = sched[i];
      double ts = start[i], dur = end[i] - start[i];
      cur += L.alloc_bytes[i];
      switch (inst.kind) {
        case ir::Instruction::Kind::Run: {
          const ir::Node& n = g.node(inst.node);
          std::string args = R"("node":)";
          appendJsonString(args, g.nodeRef(inst.node));
          if (!n.layer.empty()) {
            args += R"(,"layer":)";
            appendJsonString(args, n.layer);
          }
          if (n.phase) args += fmt::format(R"(,"phase":"{}")", ir::name(*n.phase));
          span(out, n.qualifiedName(), "run", d, kComputeTrack, ts, dur, args);
          out += fmt::format(R"({{"name":"memory","ph":"C","pid":{},"ts":{:.3f},"args":{{"bytes":{}}}}},)",
                             d, ts, cur + L.temp_bytes[i]);
          out += "\n";
          break;
        }
        case ir::Instruction::Kind::Send:
          span(out, fmt::format("send %{} -> {}", g.value(inst.value).name, inst.peer), "send", d,
               kSendTrack, ts, dur, fmt::format(R"("bytes":{})", g.value(inst.value).type.bytes().value_or(0)));
          break;
        case ir::Instruction::Kind::Recv:
          span(out, fmt::format("recv %{} <- {}", g.value(inst.value).name, inst.peer), "recv", d,
               kRecvTrack, ts, dur, fmt::format(R"("bytes":{})", g.value(inst.value).type.bytes().value_or(0)));
          break;
        case ir::Instruction::Kind::Free:
          break;
      }
      for (; k < L.releases.size() && L.releases[k].after <= static_cast<int32_t>(i); ++k) {
        cur -= L.releases[k].bytes;
      }
    }
  }
  // Close the array: drop the last ",\n".
  if (out.size() >= 2 && out[out.size() - 2] == ',') out.erase(out.size() - 2, 1);
  out += "],\"displayTimeUnit\":\"ms\"}\n";
  return out;
}

void writeChromeTrace(const std::string& path, const ir::Program& p,
                      const SimulationReport& report) {
  std::string text = toChromeTrace(p, report);
  std::ofstream f(path);
  MP_CHECK(f.good(), ConfigError, "modelpar chrome-trace: cannot write '{}'", path);
  f << text;
  MP_CHECK(f.good(), ConfigError, "modelpar chrome-trace: writing '{}' failed", path);
}

}  // namespace modelpar::passes
