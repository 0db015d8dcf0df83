// planPipeline(): the issue-6 passes end to end on a symbolic step graph
// (examples/ir/skip_step_symbolic.txt). The numbers the program computes are
// checked against the unsplit step in tests/python/test_pipeline_plan.py;
// here: structure, portals vs relays, memory relations, and errors.
#include "passes/plan_pipeline.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "ir/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "tests/support/expect_error.h"
#include "tests/support/read_file.h"

namespace modelpar::passes {
namespace {

using testing::messageOf;

ir::Graph readExample(const std::string& name) {
  return ir::parseGraph(testing::readExample(name));
}

PipelinePlanOptions options(const std::string& schedule, const std::string& checkpoint,
                            bool portals = true, int devices = 4, int m = 4) {
  PipelinePlanOptions o;
  o.devices = devices;
  o.microbatches = m;
  o.batch_size = 8;
  o.schedule = schedule;
  o.checkpoint = checkpoint;
  o.portals = portals;
  return o;
}

// Destinations of every send of value `name` in the program, by source device.
std::multiset<std::pair<int, int>> sendsOf(const ir::Program& p, const std::string& name) {
  std::multiset<std::pair<int, int>> out;
  for (int d = 0; d < p.numDevices(); ++d) {
    for (const ir::Instruction& i : p.schedule(d)) {
      if (i.kind == ir::Instruction::Kind::Send && p.graph().value(i.value).name == name) {
        out.insert({d, i.peer});
      }
    }
  }
  return out;
}

int stageOfLayer(const PipelinePlan& p, const std::string& layer) {
  for (int l = 0; l < p.chain.size(); ++l) {
    if (p.chain.layers[static_cast<size_t>(l)].name == layer) {
      return p.stage_of_layer[static_cast<size_t>(l)];
    }
  }
  return -1;
}

TEST(PlanPipeline, EveryScheduleAndCheckpointModeGivesAVerifiedProgramOnItsStages) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  for (const char* schedule : {"gpipe", "1f1b", "1f1b*"}) {
    for (const char* ck : {"never", "except_last", "always"}) {
      for (bool portals : {true, false}) {
        SCOPED_TRACE(std::string(schedule) + " " + ck + (portals ? " portals" : " relay"));
        PipelinePlan p = planPipeline(step, options(schedule, ck, portals));
        EXPECT_NO_THROW(ir::verify(p.program));
        EXPECT_EQ(p.chain.size(), 5);  // l1 l2 l3 l4 loss
        EXPECT_EQ(p.numStages(), 4);
        EXPECT_EQ(p.microbatch_sizes, (std::vector<int64_t>{2, 2, 2, 2}));
        // Stages are contiguous and ascending over the chain.
        for (size_t l = 1; l < p.stage_of_layer.size(); ++l) {
          EXPECT_GE(p.stage_of_layer[l], p.stage_of_layer[l - 1]);
        }
        // Every node runs on its stage's device.
        const ir::Graph& g = p.program.graph();
        ASSERT_EQ(p.stage_of_node.size(), g.nodes().size());
        for (size_t n = 0; n < g.nodes().size(); ++n) {
          const ir::Node& node = g.nodes()[n];
          ASSERT_TRUE(node.device.has_value()) << node.op;
          if (p.stage_of_node[n] >= 0) {
            EXPECT_EQ(*node.device, p.partition.stage_device[static_cast<size_t>(
                                        p.stage_of_node[n])])
                << g.value(node.outputs.empty() ? 0 : node.outputs[0]).name;
          }
        }
        // Recompute nodes exist exactly when checkpointing.
        int recompute = 0;
        for (const ir::Node& node : g.nodes()) {
          recompute += node.phase == ir::Phase::Recompute;
        }
        if (std::string(ck) == "never") {
          EXPECT_EQ(recompute, 0);
        } else {
          EXPECT_GT(recompute, 0);
        }
        EXPECT_GT(p.stepTimeUs(), 0);
        EXPECT_GT(p.single_device_us, 0);
        EXPECT_NE(p.summary().find("stage 0 on device"), std::string::npos);
      }
    }
  }
}

TEST(PlanPipeline, SkipTensorGoesStraightToItsReaderWithPortalsAndStageByStageWithout) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  PipelinePlan with = planPipeline(step, options("gpipe", "never", true));
  int s1 = stageOfLayer(with, "l1"), s3 = stageOfLayer(with, "l3");
  ASSERT_GE(s3 - s1, 2) << "the test needs the skip to jump a stage";
  int d1 = with.partition.stage_device[static_cast<size_t>(s1)];
  int d3 = with.partition.stage_device[static_cast<size_t>(s3)];
  // h1 of micro-batch 0 is read by l2 (next stage) and l3 (two stages on):
  // one send to each, straight from l1's device.
  std::multiset<std::pair<int, int>> sends = sendsOf(with.program, "h1.mb0");
  EXPECT_EQ(sends.count({d1, d3}), 1u);
  for (const auto& [src, dst] : sends) EXPECT_EQ(src, d1);

  PipelinePlan without = planPipeline(step, options("gpipe", "never", false));
  EXPECT_EQ(sendsOf(without.program, "h1.mb0").count({d1, d3}), 0u)
      << "without portals the skip is relayed, never sent over the stage between";
  EXPECT_GT(without.simulation.num_transfers, with.simulation.num_transfers);
}

TEST(PlanPipeline, CheckpointingAndOneFOneBLowerTheFirstStagesSimulatedPeak) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  auto peak0 = [&](const char* schedule, const char* ck) {
    PipelinePlan p = planPipeline(step, options(schedule, ck, true, 4, 8));
    return p.simulation.devices[0].peak_bytes;
  };
  EXPECT_LT(peak0("gpipe", "always"), peak0("gpipe", "never"));
  EXPECT_LE(peak0("gpipe", "except_last"), peak0("gpipe", "never"));
  EXPECT_LT(peak0("1f1b", "never"), peak0("gpipe", "never"));
}

TEST(PlanPipeline, OneDeviceIsOneStageAndPipelinesGainOnMore) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  PipelinePlan one = planPipeline(step, options("gpipe", "never", true, 1, 4));
  EXPECT_EQ(one.numStages(), 1);
  EXPECT_EQ(one.program.numDevices(), 1);
  EXPECT_NEAR(one.idealSpeedup(), 1.0, 1e-12);
  PipelinePlan four = planPipeline(step, options("gpipe", "never", true, 4, 8));
  EXPECT_NEAR(four.idealSpeedup(), 4.0 * 8 / 11, 1e-12);
  EXPECT_GT(four.bubbleFraction(), 0.0);
  EXPECT_LT(four.bubbleFraction(), 1.0);
}

// Note [In-place writes to graph inputs] in a pipeline: a decode step writes
// its cache input back per micro-batch with nodes of the last layer; the
// writes run where the cache is bound (its first reader's stage), not on a
// stage that holds a received copy.
TEST(PlanPipeline, WritesToAnInputRunWhereTheInputIsBound) {
  ir::Graph g = ir::parseGraph(R"(
graph @decode(%x: f32[B, 4] input, %cache: f32[B, 4] input) {
  %h: f32[B, 4] = aten::add.Tensor(%x, %cache) {layer="l0", phase=fwd}
  %n: f32[B, 4] = aten::mul.Tensor(%h, 2) {layer="l0", phase=fwd}
  %y: f32[B, 4] = aten::relu(%n) {layer="l1", phase=fwd}
  %w: f32[B, 4] = aten::copy_(%cache, %n) {layer="l1", phase=fwd}
  return %y, %w
}
)");
  PipelinePlan p = planPipeline(g, options("gpipe", "never", true, 2, 2));
  ir::verify(p.program);
  const ir::Graph& pg = p.program.graph();
  int home = -1;
  for (const ir::Input& in : pg.inputs()) {
    if (pg.value(in.value).name == "cache") home = in.device.value_or(-1);
  }
  ASSERT_EQ(home, stageOfLayer(p, "l0"));
  ASSERT_NE(stageOfLayer(p, "l1"), home);
  int writes = 0;
  for (int d = 0; d < p.program.numDevices(); ++d) {
    for (const ir::Instruction& i : p.program.schedule(d)) {
      if (i.kind != ir::Instruction::Kind::Run || pg.node(i.node).op != "aten::copy_") continue;
      EXPECT_EQ(d, home) << pg.nodeRef(i.node);
      ++writes;
    }
  }
  EXPECT_EQ(writes, 2);  // one per micro-batch
}

TEST(PlanPipeline, BadOptionsAreNamedBeforeAnyPassRuns) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  auto o = options("gpipe", "never");
  o.schedule = "zigzag";
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "schedule='zigzag' is not valid; schedule takes one of 'gpipe', '1f1b', '1f1b*'");
  o = options("gpipe", "sometimes");
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "checkpoint='sometimes' is not valid");
  o = options("gpipe", "never");
  o.partition = "random";
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "partition='random' is not valid");
  o = options("gpipe", "never");
  o.partition = "madpipe";
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "give schedule='1f1b*' with it");
  o = options("gpipe", "never");
  o.microbatches = 9;
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "microbatches=9 is more than the batch size 8");
  o = options("gpipe", "never");
  o.batch_size.reset();
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }), "batch_size is required");
  o = options("gpipe", "never");
  o.devices = 0;
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }), "devices=0 is not valid");
}

TEST(PlanPipeline, StaticBatchAndTooLittleMemoryAreClearErrors) {
  ir::Graph fixed = readExample("mlp_step.txt");
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(fixed, options("gpipe", "never")); }),
             "dynamic=True");
  ir::Graph step = readExample("skip_step_symbolic.txt");
  auto o = options("1f1b", "never");
  o.memory_bytes = {4096};
  EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { planPipeline(step, o); }),
             "but the device has 4.0 KiB (4096 bytes)");
  o.schedule = "1f1b*";  // the partition's model chooses 1F1B*'s in-flight counts, and refuses
  EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { planPipeline(step, o); }),
             "of 4.0 KiB under 1f1b*");
}

// A memory limit per device is checked per device: each device's simulated
// peak against that device's own capacity (before, every device was held to
// the smallest: a plan that fitted its devices was refused). Looping
// (interleaved), V placements and zb-h1 count theirs per device too. The
// limit is what the simulated peak needs, not the partition's estimate
// (Note [The simulated peak decides]).
TEST(PlanPipeline, PerDeviceMemoryLimitsAreEachDevicesOwn) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}) {
    SCOPED_TRACE(schedule);
    const int devices = std::string(schedule) == "interleaved" || std::string(schedule) == "zb-v" ? 2 : 4;
    auto o = options(schedule, "never", true, devices, 4);
    const PipelinePlan free = planPipeline(step, o);
    std::vector<int64_t> need;
    for (const DeviceReport& d : free.simulation.devices) need.push_back(d.peak_bytes);
    ASSERT_EQ(need.size(), static_cast<size_t>(devices));
    ASSERT_NE(*std::min_element(need.begin(), need.end()), *std::max_element(need.begin(), need.end()));
    const auto most = static_cast<size_t>(std::max_element(need.begin(), need.end()) - need.begin());
    o.memory_bytes = need;  // each device exactly its simulated peak
    PipelinePlan fits;
    ASSERT_NO_THROW(fits = planPipeline(step, o));
    EXPECT_EQ(fits.partition.stage_begin, free.partition.stage_begin);
    for (size_t d = 0; d < need.size(); ++d) {
      EXPECT_EQ(fits.simulation.devices[d].peak_bytes, need[d]) << "device " << d;
    }
    // One byte short on the device that needs the most: refused, naming it.
    o.memory_bytes[most] -= 1;
    EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { planPipeline(step, o); }),
               fmt::format("does not fit device {}: its simulated peak memory", most));
  }
}

// checkpoint='per_layer' (Note [Recompute per layer]): 1F1B on 2 devices,
// batch 64 in 4 micro-batches, limited to what checkpoint='always' needs.
// except_last does not fit there; per_layer recomputes some layers, not all,
// fits every device, and its step is shorter than always's (which
// recomputes every layer's forward). With no limit it recomputes nothing
// and is the never plan; below always's peak it is refused, naming itself.
TEST(PlanPipeline, PerLayerRecomputesTheFewestLayersThatFitTheLimit) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  auto o = options("1f1b", "never", true, 2, 4);
  o.batch_size = 64;
  const PipelinePlan never = planPipeline(step, o);
  o.checkpoint = "always";
  const PipelinePlan always = planPipeline(step, o);
  int64_t limit = 0;
  for (const DeviceReport& d : always.simulation.devices) limit = std::max(limit, d.peak_bytes);
  int64_t never_peak = 0;
  for (const DeviceReport& d : never.simulation.devices) never_peak = std::max(never_peak, d.peak_bytes);
  ASSERT_LT(limit, never_peak);  // the limit binds
  o.memory_bytes = {limit};
  o.checkpoint = "except_last";
  EXPECT_THROW(planPipeline(step, o), PlanDoesNotFitError);

  o.checkpoint = "per_layer";
  const PipelinePlan chosen = planPipeline(step, o);
  for (const DeviceReport& d : chosen.simulation.devices) EXPECT_LE(d.peak_bytes, limit);
  EXPECT_FALSE(chosen.recomputed_layers.empty());
  EXPECT_LT(chosen.recomputed_layers.size(), static_cast<size_t>(chosen.chain.size()));
  EXPECT_LT(chosen.stepTimeUs(), always.stepTimeUs());
  EXPECT_HAS(chosen.summary(), fmt::format("recomputed: {} of {} layers", chosen.recomputed_layers.size(),
                                           chosen.chain.size()));

  // No limit that binds: nothing recomputed, the never plan.
  o.memory_bytes.clear();
  const PipelinePlan free = planPipeline(step, o);
  EXPECT_TRUE(free.recomputed_layers.empty());
  EXPECT_EQ(ir::print(free.program), ir::print(never.program));
  EXPECT_HAS(free.summary(), "recomputed: 0 of");

  // Below always's peak: refused, saying per_layer recomputed everything.
  o.memory_bytes = {limit - 1};
  EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { planPipeline(step, o); }),
             "with checkpoint='per_layer' even with every layer of its stages recomputed");
}

// Interleaved 1F1B: the 5-layer chain cut into devices x v = 2 x 2 stages,
// stage s on device s % 2, every node on its stage's device, in every
// checkpoint mode, with and without portals.
TEST(PlanPipeline, InterleavedCutsDevicesTimesVirtualStagesPlacedLooping) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  for (const char* ck : {"never", "except_last", "always"}) {
    for (bool portals : {true, false}) {
      SCOPED_TRACE(std::string(ck) + (portals ? " portals" : " relay"));
      PipelinePlan p = planPipeline(step, options("interleaved", ck, portals, 2, 4));
      EXPECT_NO_THROW(ir::verify(p.program));
      EXPECT_EQ(p.virtual_stages, 2);  // the default for "interleaved"
      EXPECT_EQ(p.numStages(), 4);
      EXPECT_EQ(p.partition.stage_device, (std::vector<int>{0, 1, 0, 1}));
      EXPECT_EQ(p.program.numDevices(), 2);
      const ir::Graph& g = p.program.graph();
      for (size_t n = 0; n < g.nodes().size(); ++n) {
        if (p.stage_of_node[n] < 0) continue;
        EXPECT_EQ(g.nodes()[n].device, p.stage_of_node[n] % 2) << g.nodeRef(static_cast<ir::NodeId>(n));
      }
      EXPECT_GT(p.stepTimeUs(), 0);
      EXPECT_GT(p.bubbleFraction(), 0.0);
      EXPECT_LT(p.bubbleFraction(), 1.0);
      EXPECT_NEAR(p.idealSpeedup(), 2.0 * 2 * 4 / (2 * 4 + 2 - 1), 1e-12);  // p·v·m/(v·m+p-1)
      EXPECT_NE(p.summary().find("schedule interleaved (v=2 stages per device, placed looping)"),
                std::string::npos) << p.summary();
    }
  }
  // v given: 1 is allowed (one stage per device, Megatron's warm-up).
  PipelinePlanOptions o = options("interleaved", "never", true, 2, 4);
  o.virtual_stages = 1;
  PipelinePlan one = planPipeline(step, o);
  EXPECT_EQ(one.numStages(), 2);
  EXPECT_EQ(one.virtual_stages, 1);
  EXPECT_EQ(one.summary().find("stages per device"), std::string::npos);
}

TEST(PlanPipeline, VirtualStagesErrorsNameTheOptionAndTheWayOut) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  auto o = options("gpipe", "never", true, 2, 4);
  o.virtual_stages = 2;
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "virtual_stages=2 needs schedule='interleaved', the schedule that runs several "
             "stages per device in turn (got schedule='gpipe')");
  o = options("interleaved", "never", true, 2, 4);
  o.virtual_stages = -1;
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "virtual_stages=-1 is not valid; it takes an int >= 0");
  o.virtual_stages = 40;
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "virtual_stages=40 on devices=2 makes 80 stages; at most 64 stages are planned; use "
             "virtual_stages=32 or fewer");
  // 5 layers (l1 l2 l3 l4 loss) cannot make 4 x 2 stages.
  o = options("interleaved", "never", true, 4, 4);
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "graph @skip_step has 5 layers, so it cannot be cut into devices=4 x "
             "virtual_stages=2 = 8 stages for schedule 'interleaved'; use virtual_stages=1 or "
             "fewer");
  // PipeDream's DP keeps no cut whose transfer costs more than the compute it
  // spreads: over 1-second links, one stage.
  o = options("interleaved", "never", true, 2, 4);
  o.partition = "balance-time-comm";
  o.machine = DeviceModel::uniform(2, DeviceSpec{}, LinkSpec{1e6, 1e9});
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "partition='balance-time-comm' cut the 5 layers into 1 stage, not the devices=2 x "
             "virtual_stages=2 = 4 that schedule 'interleaved' places looping");
  // The looped stages' memory is each device's simulated peak, and the way
  // out names fewer virtual stages.
  o = options("interleaved", "never", true, 2, 4);
  o.memory_bytes = {4096};
  EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { planPipeline(step, o); }),
             "does not fit device 0: its simulated peak memory is 18.2 KiB (18688 bytes) but the "
             "device has 4.0 KiB (4096 bytes); use more micro-batches, fewer virtual stages,");
}

// planPipeline runs its passes through the same runner as planPlacement:
// progress for every pass, the IR verified after each (a broken invariant
// names the pass), and a dump per pass.
TEST(PlanPipeline, RunsEveryPassThroughTheRunnerWithProgressVerificationAndDumps) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "modelpar_plan_pipeline_dump_test";
  fs::remove_all(dir);
  ir::Graph step = readExample("skip_step_symbolic.txt");
  PipelinePlanOptions o = options("1f1b", "except_last", true, 2, 4);
  o.dump_dir = dir.string();
  std::vector<std::string> finished;
  o.progress = [&](const PassEvent& e) {
    if (e.finished) finished.push_back(std::string(e.pass));
    EXPECT_EQ(e.count, 11);
  };
  PipelinePlan p = planPipeline(step, o);
  EXPECT_EQ(finished, (std::vector<std::string>{"layer-order", "microbatch-1", "cost-1", "chain",
                                                "partition", "microbatch", "fuse-accumulation",
                                                "cost", "checkpoint", "schedule", "simulate"}));
  ASSERT_EQ(p.stats.size(), 11u);
  // The IR passes leave dumps that parse back; the schedule's is the Program.
  std::string name = step.name();
  EXPECT_NO_THROW(ir::parseGraph(testing::readFile(dir / (name + ".pipeline-06-microbatch.txt"))));
  ir::Program lowered = ir::parseProgram(testing::readFile(dir / (name + ".pipeline-10-schedule.txt")));
  EXPECT_EQ(lowered.numDevices(), p.program.numDevices());
  EXPECT_FALSE(fs::exists(dir / (name + ".pipeline-05-partition.txt")));  // no IR to dump
  fs::remove_all(dir);

  // A broken invariant after checkpoint is named, and nothing is returned.
  o.dump_dir = "";
  o.progress = nullptr;
  o.after_pass = [](std::string_view pass, ir::Graph& g, ir::Program*) {
    if (pass == "checkpoint") g.node(0).cost = ir::Cost{-1.0, 0, 0, 0};
  };
  std::string msg = messageOf<InvalidIrError>([&] { planPipeline(step, o); });
  EXPECT_NE(msg.find("modelpar pipeline: the IR after pass 'checkpoint' breaks an invariant"),
            std::string::npos) << msg;
}

// ZB-H1 on the 5-layer symbolic step, 2 and 4 devices, m = 4 and 8, every
// checkpoint mode: the partition counts memory as 1F1B's, so both schedules
// get the same stages; the program verifies and is faster than 1F1B's (the
// W's fill its bubble: 4 devices, m = 4, never: 560 us against 680 us).
// Peak memory, measured: device 0 equal (it defers no W); later devices hold
// the inputs of deferred W's, at most 1.24 times 1F1B's (4 devices, m = 4:
// the last device 2532 bytes against 2052); the largest peak over the
// devices at most 1.04 times 1F1B's (equal on 2 devices; "always", 4
// devices, m = 4: 13824 against 13312).
TEST(PlanPipeline, ZeroBubbleH1IsFasterThanOneFOneBOnTheSameStages) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  for (const char* ck : {"never", "except_last", "always"}) {
    for (int devices : {2, 4}) {
      for (int m : {4, 8}) {
        SCOPED_TRACE(std::string(ck) + " devices=" + std::to_string(devices) + " m=" + std::to_string(m));
        PipelinePlan zb = planPipeline(step, options("zb-h1", ck, true, devices, m));
        PipelinePlan one = planPipeline(step, options("1f1b", ck, true, devices, m));
        EXPECT_NO_THROW(ir::verify(zb.program));
        EXPECT_EQ(zb.partition.stage_begin, one.partition.stage_begin);
        EXPECT_EQ(zb.partition.stage_device, one.partition.stage_device);
        ASSERT_EQ(zb.simulation.devices.size(), one.simulation.devices.size());
        EXPECT_LT(zb.stepTimeUs(), one.stepTimeUs());
        EXPECT_LT(zb.bubbleFraction(), one.bubbleFraction());
        const double n = zb.numStages();
        EXPECT_NEAR(zb.idealSpeedup(), n * 3 * m / (3 * m + n - 1), 1e-12);
        int64_t zb_max = 0, one_max = 0;
        for (size_t d = 0; d < zb.simulation.devices.size(); ++d) {
          const int64_t a = zb.simulation.devices[d].peak_bytes, b = one.simulation.devices[d].peak_bytes;
          if (d == 0) EXPECT_EQ(a, b);
          EXPECT_GE(a, b) << "device " << d;
          EXPECT_LE(static_cast<double>(a), 1.24 * static_cast<double>(b)) << "device " << d;
          zb_max = std::max(zb_max, a);
          one_max = std::max(one_max, b);
        }
        EXPECT_LE(static_cast<double>(zb_max), 1.04 * static_cast<double>(one_max));
      }
    }
  }
}

// ZB-V on the 5-layer symbolic step: devices x 2 stages placed in a V,
// every node on its stage's device, in every checkpoint mode, with and
// without portals; the program verifies. Against 1F1B and ZB-H1 on 2
// devices (2 stages of their own cut), measured: for m >= 4 ZB-V is the
// fastest (never, m = 4: 730 us, ZB-H1 790, 1F1B 870); with m = 1 ZB-H1 is
// (310 us, ZB-V 330: 4 stages' transfers for one micro-batch). Memory: the
// V puts l2 and l3, the two 32x32 layers, on device 1, which peaks up to
// 1.28 times 1F1B's largest ("always", relayed, m = 4: 22272 bytes against
// 17408), while
// device 0 (l1 and l4) peaks at about half 1F1B's; the two peaks together
// stay under 1F1B's (31204 against 31972 bytes, never, m = 4).
TEST(PlanPipeline, ZeroBubbleVCutsTwoStagesPerDevicePlacedInAV) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  for (const char* ck : {"never", "except_last", "always"}) {
    for (bool portals : {true, false}) {
      for (int m : {1, 4, 8}) {
        SCOPED_TRACE(std::string(ck) + (portals ? " portals" : " relay") + " m=" + std::to_string(m));
        PipelinePlan p = planPipeline(step, options("zb-v", ck, portals, 2, m));
        EXPECT_NO_THROW(ir::verify(p.program));
        EXPECT_EQ(p.virtual_stages, 2);  // the default for "zb-v"
        EXPECT_EQ(p.numStages(), 4);
        EXPECT_EQ(p.partition.stage_device, (std::vector<int>{0, 1, 1, 0}));
        EXPECT_EQ(p.program.numDevices(), 2);
        const std::vector<int> vee{0, 1, 1, 0};
        const ir::Graph& g = p.program.graph();
        for (size_t n = 0; n < g.nodes().size(); ++n) {
          if (p.stage_of_node[n] < 0) continue;
          EXPECT_EQ(g.nodes()[n].device, vee[static_cast<size_t>(p.stage_of_node[n])])
              << g.nodeRef(static_cast<ir::NodeId>(n));
        }
        // p = 2: p·6m / max(6m + p-1, 4(m + p) - 2).
        EXPECT_NEAR(p.idealSpeedup(), 2.0 * 6 * m / std::max(6.0 * m + 1, 4.0 * (m + 2) - 2), 1e-12);
        EXPECT_NE(p.summary().find("schedule zb-v (v=2 stages per device, placed in a V)"),
                  std::string::npos) << p.summary();
        const PipelinePlan one = planPipeline(step, options("1f1b", ck, portals, 2, m));
        const PipelinePlan h1 = planPipeline(step, options("zb-h1", ck, portals, 2, m));
        EXPECT_LT(p.stepTimeUs(), one.stepTimeUs());
        if (m >= 4) EXPECT_LT(p.stepTimeUs(), h1.stepTimeUs());
        const auto& zd = p.simulation.devices;
        const auto& od = one.simulation.devices;
        ASSERT_EQ(zd.size(), 2u);
        ASSERT_EQ(od.size(), 2u);
        const double one_max = static_cast<double>(std::max(od[0].peak_bytes, od[1].peak_bytes));
        EXPECT_LE(static_cast<double>(std::max(zd[0].peak_bytes, zd[1].peak_bytes)), 1.28 * one_max);
        EXPECT_LE(zd[0].peak_bytes + zd[1].peak_bytes, od[0].peak_bytes + od[1].peak_bytes);
      }
    }
  }
}

// virtual_stages other than 2 (or unset), and a chain too short for
// devices x 2 stages, are refused naming the way out.
TEST(PlanPipeline, ZeroBubbleVRefusesOtherVirtualStagesAndTooFewLayers) {
  ir::Graph step = readExample("skip_step_symbolic.txt");
  for (int v : {1, 3}) {
    auto o = options("zb-v", "never", true, 2, 4);
    o.virtual_stages = v;
    EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
               fmt::format("virtual_stages={} is not valid with schedule='zb-v', which runs "
                           "exactly 2 stages per device, placed in a V (Note [ZB-V]); give "
                           "virtual_stages=2 or leave it unset", v));
  }
  auto o = options("zb-v", "never", true, 2, 4);
  o.virtual_stages = 2;
  EXPECT_NO_THROW(planPipeline(step, o));
  // 5 layers (l1 l2 l3 l4 loss) cannot make 4 x 2 stages.
  o = options("zb-v", "never", true, 4, 4);
  EXPECT_HAS(messageOf<ConfigError>([&] { planPipeline(step, o); }),
             "graph @skip_step has 5 layers, so it cannot be cut into devices=4 x "
             "virtual_stages=2 = 8 stages for schedule 'zb-v'; use fewer devices");
  // The V's memory is each device's simulated peak.
  o = options("zb-v", "never", true, 2, 4);
  o.memory_bytes = {4096};
  EXPECT_HAS(messageOf<PlanDoesNotFitError>([&] { planPipeline(step, o); }),
             "does not fit device 0: its simulated peak memory is 8.7 KiB (8932 bytes)");
}

}  // namespace
}  // namespace modelpar::passes
