// PassRunner: timing rows, progress events, the hook, verification naming the
// pass, and dumps — the runner every entry point shares (plan_placement_test
// and plan_pipeline_test check it through the entry points).
#include "passes/pass_runner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/parser.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

constexpr const char* kTwoOps = R"(
graph @two(%x: f32[4] input) {
  %a: f32[4] = aten::relu(%x)
  %b: f32[4] = aten::neg(%a)
  return %b
}
)";

TEST(PassRunner, ReturnsWhatThePassReturnsAndTimesItInOrder) {
  PassRunnerOptions o;
  std::vector<std::string> events;
  o.progress = [&](const PassEvent& e) {
    events.push_back(std::string(e.pass) + (e.finished ? " end " : " start ") +
                     std::to_string(e.index) + "/" + std::to_string(e.count));
  };
  PassRunner r("test", "g", 2, o);
  int v = r.run("first", [] { return 7; });
  r.last().detail = "seven";
  r.run("second", [] {});
  EXPECT_EQ(v, 7);
  EXPECT_EQ(events, (std::vector<std::string>{"first start 0/2", "first end 0/2",
                                              "second start 1/2", "second end 1/2"}));
  std::vector<PassStats> rows = r.take();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].pass, "first");
  EXPECT_EQ(rows[0].detail, "seven");
  EXPECT_GE(rows[1].seconds, 0.0);
}

TEST(PassRunner, NamesEntryAndPassWhenTheIrBreaksAnInvariant) {
  PassRunnerOptions o;
  o.after_pass = [](std::string_view pass, ir::Graph& g, ir::Program*) {
    if (pass == "breaker") g.node(1).cost = ir::Cost{-1.0, 0, 0};
  };
  ir::Graph g = ir::parseGraph(kTwoOps);
  PassRunner r("test", g.name(), 2, o);
  r.run("fine", [] {});
  EXPECT_NO_THROW(r.verifyGraph(g));
  r.run("breaker", [] {});
  try {
    r.verifyGraph(g);
    FAIL() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("modelpar test: the IR after pass 'breaker' breaks an "
                                         "invariant"), std::string::npos) << e.what();
  }
}

TEST(PassRunner, SkipsTheVerifierWhenAskedButStillCallsTheHook) {
  PassRunnerOptions o;
  o.verify = false;
  int hooked = 0;
  o.after_pass = [&](std::string_view, ir::Graph& g, ir::Program*) {
    ++hooked;
    g.node(1).cost = ir::Cost{-1.0, 0, 0};
  };
  ir::Graph g = ir::parseGraph(kTwoOps);
  PassRunner r("test", g.name(), 1, o);
  r.run("breaker", [] {});
  EXPECT_NO_THROW(r.verifyGraph(g));
  EXPECT_EQ(hooked, 1);
}

TEST(PassRunner, DumpsEachPassAsNumberedIrTextThatParsesBack) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "modelpar_pass_runner_dump_test";
  fs::remove_all(dir);
  PassRunnerOptions o;
  o.dump_dir = dir.string();
  ir::Graph g = ir::parseGraph(kTwoOps);
  PassRunner r("entry", "two graph/1", 2, o);  // unsafe characters become '_'
  r.run("a", [] {});
  r.verifyGraph(g);
  r.run("b", [] {});
  r.verifyWith(g, nullptr, [] {}, "// a report\n");
  EXPECT_EQ(ir::parseGraph(testing::readFile(dir / "two_graph_1.entry-01-a.txt")), g);
  EXPECT_EQ(testing::readFile(dir / "two_graph_1.entry-02-b.txt"), "// a report\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace modelpar::passes
