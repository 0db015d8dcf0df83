// The pass runner (pass_runner.h): timing, progress, verification after each
// pass with the pass named on failure, IR dumps.
#include "passes/pass_runner.h"

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ir/check.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace modelpar::passes {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fileSafe(std::string_view name) {
  std::string s;
  for (char c : name) {
    s += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '_';
  }
  return s.empty() ? "graph" : s;
}

}  // namespace

PassRunner::PassRunner(std::string_view entry, std::string_view graph_name, int num_passes,
                       const PassRunnerOptions& options)
    : entry_(entry), options_(options), count_(num_passes), graph_name_(fileSafe(graph_name)) {
  if (options.dump_dir) {
    dump_dir_ = *options.dump_dir;
  } else if (const char* env = std::getenv("MODELPAR_DUMP_DIR")) {
    dump_dir_ = env;
  }
  stats_.reserve(static_cast<size_t>(num_passes));
}

void PassRunner::begin(std::string_view pass) {
  stats_.push_back(PassStats{std::string(pass), 0, 0, 0, 0, {}, {}, {}});
  if (options_.progress) options_.progress(PassEvent{stats_.back().pass, index_, count_, false, 0.0});
  started_ = now();
}

void PassRunner::end() {
  PassStats& s = stats_.back();
  s.seconds = now() - started_;
  if (options_.progress) options_.progress(PassEvent{s.pass, index_, count_, true, s.seconds});
  ++index_;
}

void PassRunner::verifyWith(ir::Graph& graph, ir::Program* program,
                            const std::function<void()>& check, const std::string& dump_text) {
  MP_INTERNAL_ASSERT(!stats_.empty(), "{}: verify before any pass ran", entry_);
  const std::string pass = stats_.back().pass;
  if (options_.after_pass) options_.after_pass(pass, graph, program);
  if (options_.verify) {
    double t0 = now();
    try {
      check();
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      MP_THROW(InvalidIrError, "modelpar {}: the IR after pass '{}' breaks an invariant: {}",
               entry_, pass, e.what());
    }
    stats_.back().verify_seconds = now() - t0;
  }
  if (dumping()) dump(dump_text.empty() ? (program ? ir::print(*program) : ir::print(graph)) : dump_text);
}

void PassRunner::verifyGraph(ir::Graph& graph, const std::string& dump_text) {
  verifyWith(graph, nullptr, [&] { ir::verify(graph); }, dump_text);
}

void PassRunner::verifyProgram(ir::Program& program, const std::string& dump_text) {
  // The hook sees the program's own graph, which the passes after lower read.
  verifyWith(program.graph(), &program, [&] { ir::verify(program); },
             dump_text);
}

void PassRunner::dump(const std::string& text) {
  if (dump_dir_.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dump_dir_, ec);
  MP_CHECK(!ec, ConfigError, "modelpar {}: cannot create the dump folder '{}' ({}); fix "
           "MODELPAR_DUMP_DIR or the dump_dir option", entry_, dump_dir_, ec.message());
  fs::path path = fs::path(dump_dir_) /
                  fmt::format("{}.{}-{:02d}-{}.txt", graph_name_, entry_, index_, stats_.back().pass);
  std::ofstream out(path);
  out << text;
  MP_CHECK(out.good(), ConfigError, "modelpar {}: cannot write the IR dump '{}'", entry_,
           path.string());
}

}  // namespace modelpar::passes
