// Chrome trace of a measured step (execution_trace.h): "X" events for runs,
// transfers and receive waits, "M" metadata naming processes and tracks.
#include "runtime/execution_trace.h"

#include <cstdio>
#include <fstream>

#include "ir/printer.h"
#include "runtime/check.h"

namespace modelpar::runtime {
namespace {

constexpr int kComputeTrack = 0, kSendTrack = 1, kRecvTrack = 2;

void appendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1000.0);
  return buf;
}

void meta(std::string& out, const char* what, int pid, int tid, const std::string& name) {
  out += c10::str(R"({"name":")", what, R"(","ph":"M","pid":)", pid, R"(,"tid":)", tid,
                  R"(,"args":{"name":)");
  appendJsonString(out, name);
  out += "}},\n";
}

void span(std::string& out, const std::string& name, const char* cat, int pid, int tid,
          const Span& s, const std::string& args) {
  out += R"({"name":)";
  appendJsonString(out, name);
  out += c10::str(R"(,"cat":")", cat, R"(","ph":"X","pid":)", pid, R"(,"tid":)", tid,
                  R"(,"ts":)", micros(s.start_ns), R"(,"dur":)", micros(s.end_ns - s.start_ns),
                  R"(,"args":{)", args, "}},\n");
}

}  // namespace

std::string toChromeTrace(const ir::Program& p, const ExecutionTrace& trace) {
  const size_t n = static_cast<size_t>(p.numDevices());
  MP_RT_CHECK(!trace.empty(), ConfigError,
              "modelpar executor trace: nothing was recorded; run with record_trace=true");
  MP_RT_CHECK(trace.host.size() == n && trace.transfer.size() == n, ConfigError,
              "modelpar executor trace: the trace has ", trace.host.size(),
              " devices but the program has ", n);
  const ir::Graph& g = p.graph();
  std::string out = "{\"traceEvents\":[\n";
  for (int d = 0; d < p.numDevices(); ++d) {
    meta(out, "process_name", d, 0, c10::str("device ", d, " (measured)"));
    meta(out, "thread_name", d, kComputeTrack, "compute");
    meta(out, "thread_name", d, kSendTrack, "send");
    meta(out, "thread_name", d, kRecvTrack, "recv");
    const std::vector<ir::Instruction>& sched = p.schedule(d);
    const std::vector<Span>& host = trace.host[static_cast<size_t>(d)];
    const std::vector<Span>& transfer = trace.transfer[static_cast<size_t>(d)];
    MP_RT_CHECK(host.size() == sched.size() && transfer.size() == sched.size(), ConfigError,
                "modelpar executor trace: device ", d, " has ", host.size(),
                " spans but ", sched.size(), " instructions");
    for (size_t i = 0; i < sched.size(); ++i) {
      const ir::Instruction& inst = sched[i];
      const std::string index = c10::str(R"("instruction":)", i);
      switch (inst.kind) {
        case ir::Instruction::Kind::Run: {
          if (host[i].empty()) break;
          const ir::Node& node = g.node(inst.node);
          std::string args = index + R"(,"node":)";
          appendJsonString(args, g.nodeRef(inst.node));
          if (!node.layer.empty()) {
            args += R"(,"layer":)";
            appendJsonString(args, node.layer);
          }
          span(out, node.qualifiedName(), "run", d, kComputeTrack, host[i], args);
          break;
        }
        case ir::Instruction::Kind::Send:
          if (transfer[i].empty()) break;
          span(out, ir::printInstruction(g, inst), "send", d, kSendTrack, transfer[i],
               index + c10::str(R"(,"bytes":)", g.value(inst.value).type.bytes().value_or(0)));
          break;
        case ir::Instruction::Kind::Recv:
          if (host[i].empty()) break;
          span(out, ir::printInstruction(g, inst), "recv", d, kRecvTrack, host[i], index);
          break;
        case ir::Instruction::Kind::Free:
          break;
      }
    }
  }
  if (out.size() >= 2 && out[out.size() - 2] == ',') out.erase(out.size() - 2, 1);
  out += "],\"displayTimeUnit\":\"ms\"}\n";
  return out;
}

void writeChromeTrace(const std::string& path, const ir::Program& p, const ExecutionTrace& trace) {
  const std::string text = toChromeTrace(p, trace);
  std::ofstream f(path);
  MP_RT_CHECK(f.good(), ConfigError, "modelpar executor trace: cannot write '", path, "'");
  f << text;
  MP_RT_CHECK(f.good(), ConfigError, "modelpar executor trace: writing '", path, "' failed");
}

}  // namespace modelpar::runtime
