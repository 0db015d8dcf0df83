// planPlacement(): the sequence of passes end to end on hand-computed graphs, its option
// checks, verification naming the pass, dumps, progress, statistics, and the
// caller's graph left untouched when anything throws.
#include "passes/plan_placement.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "tests/passes/test_graphs.h"

namespace modelpar::passes {
namespace {

using testing::machine;
using testing::kDiamond;
using testing::kDiamondNoLayers;

PlacementOptions twoDevices(std::string placer = "m-etf") {
  PlacementOptions o;
  o.machine = machine(2);
  o.placer = std::move(placer);
  o.dump_dir = "";  // tests do not follow $MODELPAR_DUMP_DIR unless they say so
  return o;
}

std::string readFile(const std::filesystem::path& p) { return modelpar::testing::readFile(p.string()); }

TEST(PlanPlacement, PlansTheDiamondAtTheHandComputedStepTime) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementPlan p = planPlacement(g, twoDevices());
  // One unit per layer (different layers are not co-placed). m-ETF:
  //   device 0: a 0..10, b 10..30, send b 30..33;
  //   device 1: recv a 10..13, c 13..33, recv b 30..33, d 33..38.
  // Step 38 us; one device: 10 + 20 + 20 + 5 = 55 us; speed-up 55 / 38.
  EXPECT_DOUBLE_EQ(p.stepTimeUs(), 38.0);
  EXPECT_DOUBLE_EQ(p.single_device_us, 55.0);
  EXPECT_DOUBLE_EQ(p.speedup(), 55.0 / 38.0);
  EXPECT_EQ(p.units.num_units, 4);
  EXPECT_EQ(p.unitsPerDevice(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p.nodesPerDevice(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p.placement.placer, "place-metf");
  EXPECT_EQ(p.simulation.num_transfers, 2);
  EXPECT_NO_THROW(ir::verify(p.program));
  EXPECT_EQ(p.cost.profiled, 4);
}

TEST(PlanPlacement, PinnedLayersRunOnTheirDevicesWhateverThePlacerChose) {
  ir::Graph g = ir::parseGraph(kDiamond);
  for (const char* placer : {"m-topo", "m-etf", "m-sct"}) {
    PlacementOptions o = twoDevices(placer);
    o.pinned_layers = {{"a", 1}, {"b", 1}, {"c", 0}, {"d", 0}};
    PlacementPlan p = planPlacement(g, o);
    EXPECT_EQ(p.placement.node_device, (std::vector<int32_t>{1, 1, 0, 0})) << placer;
    EXPECT_NO_THROW(checkPlacement(g, p.placement));
    EXPECT_NO_THROW(ir::verify(p.program));
    EXPECT_EQ(p.simulation.num_transfers, 2) << placer;  // a to 0, b to 0
  }
  PlacementOptions bad = twoDevices();
  bad.pinned_layers = {{"a", 2}};
  EXPECT_THROW(planPlacement(g, bad), ConfigError);
}

// A pinned input is bound on its device whatever reads it first (the diamond's
// %x is read by a, pinned to device 0 here): one more transfer, x to device 0.
TEST(PlanPlacement, PinnedInputsAreBoundOnTheirDevices) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementOptions o = twoDevices();
  o.pinned_layers = {{"a", 0}, {"b", 0}, {"c", 1}, {"d", 1}};
  PlacementPlan free = planPlacement(g, o);
  EXPECT_EQ(free.program.graph().inputs()[0].device.value_or(-1), 0);  // its first reader's
  o.pinned_inputs = {{"x", 1}, {"not_an_input", 0}};  // names the graph lacks are skipped
  PlacementPlan pinned = planPlacement(g, o);
  EXPECT_EQ(pinned.program.graph().inputs()[0].device.value_or(-1), 1);
  EXPECT_EQ(pinned.placement.node_device, free.placement.node_device);
  EXPECT_EQ(pinned.simulation.num_transfers, free.simulation.num_transfers + 1);
  EXPECT_NO_THROW(ir::verify(pinned.program));
  PlacementOptions bad = twoDevices();
  bad.pinned_inputs = {{"x", 2}};
  EXPECT_HAS(modelpar::testing::messageOf<ConfigError>([&] { planPlacement(g, bad); }),
             "pinned input 'x' -> device 2 is not valid; devices are 0..1");
}

// Pinning moves nodes after the placer checked memory; when that overfills a
// device the plan does not fit. Found by tests/python/test_fuzz_plans.py
// (seed 100730): it was an InternalError "simulated peak memory 264 B on
// device 1 exceeds its capacity 256 B although place-metf accepted the
// placement": pinning layer l1 (%v2, %v7) to device 1 moves them there
// after the placer had filled it to 256 B or less.
constexpr const char* kPinnedOverfill = R"(
graph @fuzz100730(%x0: f32[3, 7] input, %x1: f32[3, 3] input, %w2: f32[3, 5] param, %w3: f32[5, 2] param, %w4: f32[5, 6] param) {
  %v2: f32[3, 1] = aten::sum.dim_IntList(%x1, [1], keepdim=true, dtype=None) {layer="l1", phase=fwd, cost={time_us=33.248, out=64, temp=0, persist=0}}
  %v1: f32[3, 3] = aten::add.Tensor(%x1, %v2) {layer="l0", phase=fwd, cost={time_us=50.252, out=64, temp=0, persist=0}}
  %v3: f32[3, 5] = aten::mm(%x1, %w2) {layer="l0", phase=fwd, cost={time_us=23.522, out=1024, temp=0, persist=0}}
  %v4: f32[3, 5] = aten::neg(%v3) {layer="l0", phase=fwd, cost={time_us=0.858, out=16, temp=0, persist=0}}
  %v5: f32[3, 5] = aten::mul.Tensor(%v4, %v3) {layer="l0", phase=fwd, cost={time_us=8.611, out=1024, temp=0, persist=0}}
  %v6: f32[3, 2] = aten::mm(%v4, %w3) {layer="l0", phase=fwd, cost={time_us=57.388, out=1024, temp=0, persist=0}}
  %v7: f32[3, 6] = aten::mm(%v4, %w4) {layer="l1", phase=fwd, cost={time_us=8.929, out=64, temp=0, persist=0}}
  return %v2, %v1, %v5, %v6, %v7
}
)";

TEST(PlanPlacement, PinnedLayersThatOverfillADeviceDoNotFit) {
  ir::Graph g = ir::parseGraph(kPinnedOverfill);
  for (const char* placer : {"m-etf", "m-sct"}) {
    PlacementOptions o;
    o.devices = 3;
    o.placer = placer;
    o.memory_bytes = {256};
    o.coarsen = false;
    o.dump_dir = "";
    ASSERT_NO_THROW(planPlacement(g, o)) << placer << ": fits unpinned";
    o.pinned_layers = {{"l1", 1}};
    const std::string m = modelpar::testing::messageOf<PlanDoesNotFitError>([&] { planPlacement(g, o); });
    EXPECT_NE(m.find("graph @fuzz100730 does not fit once "), std::string::npos) << placer << ": " << m;
    EXPECT_NE(m.find("moved to pinned layers' (or written inputs') devices: device 1 needs 264 B "
                     "(264 bytes) at its simulated peak but has 256 B (256 bytes)"),
              std::string::npos) << placer << ": " << m;
  }
}

TEST(PlanPlacement, CoarseningKeepsCoplacedNodesTogether) {
  ir::Graph g = ir::parseGraph(kDiamondNoLayers);
  // b and c each feed only d, so co-placement groups {b, c, d}; a feeds two
  // nodes and stays alone. m-ETF puts a on device 0 (0..10); b could start
  // at 10 there or at 13 on device 1, so its group follows a: everything
  // runs on device 0 in 10 + 20 + 20 + 5 = 55 us.
  PlacementPlan p = planPlacement(g, twoDevices());
  EXPECT_EQ(p.units.num_units, 2);
  EXPECT_DOUBLE_EQ(p.stepTimeUs(), 55.0);
  EXPECT_EQ(p.nodesPerDevice(), (std::vector<int64_t>{4, 0}));
  // Without coarsening every node is a unit: the 38 us schedule again.
  PlacementOptions o = twoDevices();
  o.coarsen = false;
  PlacementPlan q = planPlacement(g, o);
  EXPECT_EQ(q.units.num_units, 4);
  EXPECT_DOUBLE_EQ(q.stepTimeUs(), 38.0);
  ASSERT_EQ(q.stats.size(), 4u);  // no coarsen row
  EXPECT_EQ(q.stats[1].pass, "place-metf");
}

TEST(PlanPlacement, SelectsEveryPlacerByName) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementPlan topo = planPlacement(g, twoDevices("m-topo"));
  EXPECT_EQ(topo.placement.placer, "place-mtopo");
  PlacementPlan sct = planPlacement(g, twoDevices("m-sct"));
  EXPECT_EQ(sct.placement.placer, "place-msct");
  EXPECT_GT(sct.msct.lp_rows, 0);
  for (const PlacementPlan* p : {&topo, &sct}) {
    EXPECT_NO_THROW(ir::verify(p->program));
    EXPECT_GE(p->stepTimeUs(), 38.0);  // m-ETF's 38 us is optimal here
    EXPECT_LE(p->stepTimeUs(), 55.0 + 3.0 * 2);
  }
}

TEST(PlanPlacement, CollectsOneStatisticsRowPerPass) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementPlan p = planPlacement(g, twoDevices());
  ASSERT_EQ(p.stats.size(), 5u);
  const char* ids[] = {"cost", "coarsen", "place-metf", "lower", "simulate"};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(p.stats[i].pass, ids[i]);
    EXPECT_GE(p.stats[i].seconds, 0.0);
  }
  EXPECT_EQ(p.stats[0].in, 4);
  EXPECT_EQ(p.stats[0].detail, "4 profiled, 0 analytic, 0 default");
  EXPECT_EQ(p.stats[1].out, 4);
  EXPECT_EQ(p.stats[1].out_what, "units");
  EXPECT_EQ(p.stats[2].out, 2);
  EXPECT_EQ(p.stats[2].out_what, "devices");
  EXPECT_EQ(p.stats[3].out, p.simulation.num_instructions);
  EXPECT_EQ(p.stats[3].detail.rfind("2 transfers", 0), 0u);
  std::string table = p.statsTable();
  EXPECT_NE(table.find("place-metf"), std::string::npos);
  EXPECT_NE(table.find("4 units"), std::string::npos);
  std::string s = p.summary();
  EXPECT_NE(s.find("modelpar plan @diamond: placer m-etf, 2 devices, 4 nodes in 4 units"),
            std::string::npos) << s;
  EXPECT_NE(s.find("simulated step time 38 us (one device 55 us, speed-up 1.45x)"),
            std::string::npos) << s;
  EXPECT_NE(s.find("simulate"), std::string::npos);
}

TEST(PlanPlacement, ReportsProgressForEveryPassInOrder) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementOptions o = twoDevices();
  std::vector<std::string> events;
  o.progress = [&](const PassEvent& e) {
    events.push_back(fmt::format("{}{} {}/{}", e.finished ? "-" : "+", e.pass, e.index, e.count));
  };
  planPlacement(g, o);
  std::vector<std::string> want = {"+cost 0/5",       "-cost 0/5",  "+coarsen 1/5",
                                   "-coarsen 1/5",    "+place-metf 2/5", "-place-metf 2/5",
                                   "+lower 3/5",      "-lower 3/5", "+simulate 4/5",
                                   "-simulate 4/5"};
  EXPECT_EQ(events, want);
}

TEST(PlanPlacement, DumpsTheIrAfterEveryPass) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "modelpar_pipeline_dump_test";
  fs::remove_all(dir);
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementOptions o = twoDevices();
  o.dump_dir = dir.string();
  planPlacement(g, o);
  for (const char* name : {"diamond.plan-01-cost.txt", "diamond.plan-02-coarsen.txt",
                           "diamond.plan-03-place-metf.txt", "diamond.plan-04-lower.txt",
                           "diamond.plan-05-simulate.txt"}) {
    EXPECT_TRUE(fs::exists(dir / name)) << name;
  }
  // Each dump is IR text that parses back.
  EXPECT_EQ(ir::parseGraph(readFile(dir / "diamond.plan-01-cost.txt")), g);
  ir::Graph placed = ir::parseGraph(readFile(dir / "diamond.plan-03-place-metf.txt"));
  EXPECT_TRUE(placed.node(0).device.has_value());
  ir::Program lowered = ir::parseProgram(readFile(dir / "diamond.plan-04-lower.txt"));
  EXPECT_NO_THROW(ir::verify(lowered));
  EXPECT_NE(readFile(dir / "diamond.plan-05-simulate.txt").find("// simulate: step 38 us"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(PlanPlacement, FollowsModelparDumpDirUnlessTheOptionSaysOtherwise) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "modelpar_pipeline_env_dump_test";
  fs::remove_all(dir);
  ir::Graph g = ir::parseGraph(kDiamond);
  ::setenv("MODELPAR_DUMP_DIR", dir.string().c_str(), 1);
  PlacementOptions o = twoDevices();
  o.dump_dir = std::nullopt;
  planPlacement(g, o);
  EXPECT_TRUE(fs::exists(dir / "diamond.plan-04-lower.txt"));
  fs::remove_all(dir);
  o.dump_dir = "";  // off despite the variable
  planPlacement(g, o);
  ::unsetenv("MODELPAR_DUMP_DIR");
  EXPECT_FALSE(fs::exists(dir));
}

TEST(PlanPlacement, NamesThePassAfterWhichTheIrBrokeAnInvariant) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementOptions o = twoDevices();
  // Emulate a buggy cost pass: a negative time.
  o.after_pass = [](std::string_view pass, ir::Graph& graph, ir::Program*) {
    if (pass == "cost") graph.node(1).cost->time_us = -1.0;
  };
  try {
    planPlacement(g, o);
    FAIL() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("the IR after pass 'cost' breaks an invariant"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("%b"), std::string::npos) << e.what();
  }
  // A buggy lowering: the first receive of device 1 is dropped.
  o.after_pass = [](std::string_view pass, ir::Graph&, ir::Program* p) {
    if (pass != "lower") return;
    auto& s = p->schedule(1);
    auto it = std::find_if(s.begin(), s.end(),
                           [](const ir::Instruction& i) { return i.kind == ir::Instruction::Kind::Recv; });
    s.erase(it);
  };
  try {
    planPlacement(g, o);
    FAIL() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("after pass 'lower'"), std::string::npos) << e.what();
  }
  // With verification off the broken IR reaches the simulator, which fails
  // on its own terms.
  o.verify = false;
  EXPECT_THROW(planPlacement(g, o), Error);
}

TEST(PlanPlacement, RejectsAnInputGraphThatDoesNotVerify) {
  ir::Graph g = ir::parseGraph(kDiamond);
  g.node(2).device = -3;
  try {
    planPlacement(g, twoDevices());
    FAIL() << "expected InvalidIrError";
  } catch (const InvalidIrError& e) {
    EXPECT_NE(std::string(e.what()).find("the input graph does not verify"), std::string::npos)
        << e.what();
  }
}

// Each bad option: ConfigError naming the option and the valid values.
TEST(PlanPlacement, RejectsBadOptionsNamingTheOptionAndValidValues) {
  ir::Graph g = ir::parseGraph(kDiamond);
  auto expectConfig = [&](const PlacementOptions& o, const std::string& part) {
    try {
      planPlacement(g, o);
      ADD_FAILURE() << "expected ConfigError with: " << part;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  PlacementOptions o = twoDevices();
  o.devices = 0;
  expectConfig(o, "devices=0 is not valid; devices takes an int from 1 to 64");
  o = twoDevices("m-best");
  expectConfig(o, "placer='m-best' is not valid; placer takes one of 'm-topo', 'm-etf', 'm-sct'");
  o = twoDevices();
  o.memory_bytes = {-1};
  expectConfig(o, "memory[0]=-1 bytes is not valid; memory takes sizes > 0 bytes");
  o.memory_bytes = {1 << 20, 1 << 20, 1 << 20};
  expectConfig(o, "memory has 3 values for 2 devices");
  o = twoDevices();
  o.devices = 3;  // the machine has 2 devices and is not a one-device profile
  expectConfig(o, "devices=3 but the machine profile has 2 devices");
  o = twoDevices("m-sct");
  o.msct_threshold = 2;
  expectConfig(o, "msct_threshold=2 is not valid");
  o = twoDevices();
  o.cost_options.reference_device = 5;
  expectConfig(o, "cost_options.reference_device=5 is not valid");
}

TEST(PlanPlacement, LeavesTheCallersGraphUntouchedWhenAnythingThrows) {
  // No costs: the cost pass writes them, into the pipeline's copy only.
  ir::Graph g = ir::parseGraph(R"(
graph @chain(%x: f32[1024] input, %w: f32[1024] param) {
  %a: f32[1024] = aten::mul.Tensor(%x, %w) {layer="l1"}
  %b: f32[1024] = aten::relu(%a) {layer="l2"}
  return %b
}
)");
  const ir::Graph before = g;
  const std::string text = ir::print(g);
  // 1. The placer throws: 64 bytes per device cannot hold a 4 KiB tensor.
  PlacementOptions o = twoDevices();
  o.memory_bytes = {64};
  EXPECT_THROW(planPlacement(g, o), PlanDoesNotFitError);
  EXPECT_EQ(g, before);
  // 2. A bad option.
  o = twoDevices("nope");
  EXPECT_THROW(planPlacement(g, o), ConfigError);
  EXPECT_EQ(g, before);
  // 3. A failure after the graph copy was costed and placed.
  o = twoDevices();
  o.after_pass = [](std::string_view pass, ir::Graph&, ir::Program*) {
    if (pass == "lower") throw ConfigError("injected");
  };
  EXPECT_THROW(planPlacement(g, o), ConfigError);
  EXPECT_EQ(g, before);
  EXPECT_EQ(ir::print(g), text);
  // 4. And when it succeeds.
  o.after_pass = nullptr;
  PlacementPlan p = planPlacement(g, o);
  EXPECT_EQ(g, before);
  EXPECT_TRUE(p.program.graph().node(0).cost.has_value());
}

TEST(PlanPlacement, NamesLayerDeviceAndBytesWhenThePlanDoesNotFit) {
  ir::Graph g = ir::parseGraph(kDiamond);
  PlacementOptions o = twoDevices();
  o.memory_bytes = {1536};  // 1.5 KiB per device: a's 1 KiB + x's 1 KiB do not fit
  try {
    planPlacement(g, o);
    FAIL() << "expected PlanDoesNotFitError";
  } catch (const PlanDoesNotFitError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("place-metf"), std::string::npos) << m;
    EXPECT_NE(m.find("layer 'a'"), std::string::npos) << m;
    EXPECT_NE(m.find("1.5 KiB"), std::string::npos) << m;
  }
}

TEST(PlanPlacement, ReplicatesAOneDeviceProfileAndTrimsLargerOnes) {
  DeviceSpec d;
  d.name = "cpu";
  d.memory_bytes = int64_t{1} << 30;
  PlacementOptions o;
  o.dump_dir = "";
  o.machine = DeviceModel::fromDevices({d}, LinkSpec{2.0, 1024e6});
  o.devices = 4;
  DeviceModel m = planMachine(o);
  ASSERT_EQ(m.numDevices(), 4);
  EXPECT_EQ(m.device(3).name, "cpu3");
  EXPECT_EQ(m.device(3).memory_bytes, int64_t{1} << 30);
  EXPECT_DOUBLE_EQ(m.transferUs(0, 3, 1024), 3.0);
  // Trim a 3-device machine with a fast 0-1 link to its first two devices.
  DeviceModel three = machine(3);
  three.setLink(0, 1, LinkSpec{1.0, 1e12});
  o.machine = three;
  o.devices = 2;
  o.memory_bytes = {1000, 2000};
  m = planMachine(o);
  ASSERT_EQ(m.numDevices(), 2);
  EXPECT_DOUBLE_EQ(m.link(0, 1).latency_us, 1.0);
  EXPECT_EQ(m.device(1).memory_bytes, 2000);
  // No machine: uniform default devices.
  PlacementOptions plain;
  plain.devices = 3;
  EXPECT_EQ(planMachine(plain), DeviceModel::uniform(3));
  EXPECT_EQ(planMachine(PlacementOptions{}).numDevices(), 1);
}

TEST(PlanPlacement, PlansTheMlpExampleWithAnalyticCosts) {
  const std::string text = modelpar::testing::readExample("mlp_step.txt");
  ir::Graph g = ir::parseGraph(text);
  for (std::string_view placer : kPlacerNames) {
    PlacementOptions o;
    o.dump_dir = "";
    o.devices = 2;
    o.placer = std::string(placer);
    PlacementPlan p = planPlacement(g, o);
    EXPECT_EQ(p.cost.analytic + p.cost.defaulted, static_cast<int64_t>(g.numNodes()));
    EXPECT_NO_THROW(ir::verify(p.program));
    EXPECT_GT(p.stepTimeUs(), 0.0);
    // Every layer's nodes share a device.
    for (const ir::Node& a : p.program.graph().nodes()) {
      for (const ir::Node& b : p.program.graph().nodes()) {
        if (a.layer == b.layer) EXPECT_EQ(a.device, b.device) << a.layer;
      }
    }
  }
}

}  // namespace
}  // namespace modelpar::passes
