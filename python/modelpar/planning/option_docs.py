"""What each option of ``torch.compile(model, backend="modelpar", options={...},
mode=...)`` does, one entry per key (``pipeline.<key>`` for the keys of the
``pipeline`` dict, ``mode`` for torch.compile's mode). Plain data, no imports:
the defaults come from ``options.CompileOptions`` and ``options.pipeline_options``,
the valid names from ``option_names`` (passes/option_names.h), and
``scripts/gen_options_doc.py`` joins the three into docs/options.md, failing
when a key has no entry here or an entry names no key.
"""

OPTION_DOCS: dict[str, str] = {
    "strict": (
        "A graph the runtime cannot run is an error (`UnsupportedOpError`) instead of running "
        "eagerly with a one-time warning naming what it could not import."),
    "dump_dir": (
        "A folder path, or None. Each captured graph's IR text is written there (the FX code of a "
        "graph that runs eagerly). Not given: `$MODELPAR_DUMP_DIR`, if set."),
    "partitioner": (
        "AOTAutograd's forward/backward split: `\"default\"` or `\"min_cut\"`, which recomputes "
        "cheap forward ops in the backward (phase `recompute`). In a pipeline such a step runs "
        "`checkpoint=\"never\"` unless a mode is given, which is then a `ConfigError` (a graph is "
        "checkpointed once)."),
    "devices": (
        "An int from 1 to 64, or `\"world\"`: one logical device per rank of the torch.distributed "
        "process group (see [Several processes](distributed.md)). With N >= 2 the forward and "
        "backward graphs are planned as one (passes' planJoint: a layer's backward on its "
        "forward's device, saved activations where they were made, each gradient on its "
        "parameter's device) and each runs on the multi-device executor, on CPU worker devices by "
        "default. Under `mode=\"max-autotune\"` (no options) it is one CPU worker per core."),
    "device_map": (
        "None or `\"cpu\"` (one CPU worker thread per logical device), `\"cuda\"` (device i on "
        "`cuda:i`), `\"cuda:K\"` (every logical device on one GPU, each with its own streams), or a "
        "list of `\"cuda:K\"`, one per device. CUDA maps need a CUDA build of modelpar on a machine "
        "with a GPU, otherwise a `ConfigError` says which is missing. On one H100, training on 2 "
        "and 4 logical devices of `cuda:0` equals eager (m-ETF and 1F1B; a CPU model gets its "
        "outputs and gradients back on the CPU); on one H200, the twelve transformers models of "
        "the zoo too (m-ETF, GPipe, 1F1B, `strategy=\"auto\"`). Not over a process group yet."),
    "placer": (
        "Baechi's placer for `devices` > 1: `\"m-topo\"`, `\"m-etf\"` or `\"m-sct\"` (None: m-etf; see "
        "[Placement](placement.md)). With `devices=1`, or with `strategy=\"auto\"` (which "
        "searches the placers itself), it is a `ConfigError`."),
    "memory": (
        "None, or the bytes per device (an int, or a size such as `\"16GiB\"`, `\"512MiB\"`, "
        "`\"1.5GB\"`). The plan must fit: a step that does not raises `PlanDoesNotFitError` naming "
        "layer, device and bytes at the first call, before anything runs."),
    "pipeline": (
        "None, or a dict of the `pipeline.*` keys below: pipeline parallelism over `devices` (see "
        "[Pipelines](pipelines.md)). The training step is micro-batched, cut into stages and run "
        "as one pipelined program per batch size; a static batch is traced again as a symbolic "
        "one (no `mark_dynamic` needed). A graph with fewer layers than devices (a piece a graph "
        "break left) is placed by m-ETF instead, and 1F1B of a graph that does not return the "
        "loss runs fill-drain, each with a warning."),
    "pipeline.microbatches": "Micro-batches per step, an int >= 1; sizes follow `torch.chunk`.",
    "pipeline.schedule": (
        "`\"gpipe\"` (fill-drain in torchgpipe's clock order), `\"1f1b\"`, `\"1f1b*\"` (MadPipe's "
        "in-flight counts), or `\"interleaved\"` (Megatron's interleaved 1F1B: `virtual_stages` "
        "stages per device placed looping, a bubble of (p-1)/(v·m + p-1) instead of "
        "(p-1)/(m + p-1) for v times the transfers), or `\"zb-h1\"` (zero bubble's ZB-H1: each "
        "backward split into B, the gradient sent back, and W, the weight gradients, deferred "
        "into 1F1B's bubble; about a third of 1F1B's bubble when forward, B and W take alike, "
        "the largest in-flight count of 1F1B's, later stages holding the inputs of deferred "
        "W's), or `\"zb-v\"` (zero bubble's ZB-V: the same split over 2p stages placed in a V "
        "on p devices, device d holding stages d and 2p-1-d; with forward, B and W alike a "
        "bubble of (p-1)/(6m + p-1) for m >= 2p-1, half of ZB-H1's idle time on the same "
        "layers; `virtual_stages` 2). Not given: `\"gpipe\"`, or `\"1f1b*\"` with "
        "`partition=\"madpipe\"`. 1F1B, interleaved, zb-h1 and zb-v need the loss inside the "
        "compiled function."),
    "pipeline.virtual_stages": (
        "Stages per device, v, an int >= 0: 0 is 2 for `schedule=\"interleaved\"` and "
        "`\"zb-v\"`, 1 otherwise; more than 1 only with `\"interleaved\"`, and exactly 2 with "
        "`\"zb-v\"` (a `ConfigError` otherwise). The layers are cut into devices x v stages, "
        "stage s on device s % devices (zb-v: in a V, stage s on device s for s < devices, "
        "2·devices-1-s after); a model with fewer layers is a `ConfigError` saying to use fewer. "
        "`strategy=\"auto\"` searches interleaved with 2 and 3 where the model has the layers, "
        "and zb-v."),
    "pipeline.partition": (
        "How layers are cut into stages: `\"balance-time\"`, `\"balance-size\"` (torchgpipe), "
        "`\"balance-time-comm\"` (PipeDream's DP; formerly `\"pipedream\"`, which now names the new "
        "name), `\"madpipe\"` (memory-aware DP; only with schedule `\"1f1b*\"`)."),
    "pipeline.checkpoint": (
        "`\"always\"`, `\"except_last\"` (torchgpipe's default) or `\"never\"` for every layer, "
        "or `\"per_layer\"`: the fewest layers recomputed that make each device's simulated peak "
        "fit `memory`, most bytes freed per microsecond of recomputation first (nothing where "
        "the step fits without; Note [Recompute per layer], [Pipelines](pipelines.md)). Not given: "
        "`\"except_last\"`, or `\"never\"` for a model that checkpoints itself (then a mode asked "
        "for by name is a `ConfigError`)."),
    "pipeline.portals": (
        "Skip values go straight to their readers (True) or are relayed stage by stage, as "
        "torchgpipe without portals (False)."),
    "pipeline.batch_norm": (
        "`\"deferred\"`: torchgpipe's DeferredBatchNorm (each micro-batch normalised with its own "
        "statistics, running statistics from the whole batch); `\"refuse\"`: training-mode batch "
        "norm is an error that says where it is."),
    "pipeline.allow_random": (
        "True: dropout and the other element-wise random ops draw per micro-batch, reproducible "
        "under `torch.manual_seed`; False refuses them (for a step that must equal eager bit for "
        "bit). A permutation (`randperm`) is refused either way."),
    "pipeline.loss_reduction": (
        "How micro-batch losses combine: `\"auto\"` (found from the graph), `\"mean\"` or `\"sum\"`."),
    "cuda_graphs": (
        "After one warm-up step each executor captures its program into CUDA Graphs and replays "
        "them. A program that cannot be captured runs stream replay and `print(plan)` says why; "
        "CPU worker devices always take that path (the same static-buffer protocol, tested in "
        "CI). On an H100 graph-replayed training equals eager. A graph with a dynamic batch keeps "
        "one capture per input signature (batch size), at most 8, like torch's CUDA graph trees. "
        "Not over a process group yet."),
    "kernels": (
        "`\"aten\"`: every operator runs through the dispatcher, one ATen kernel each. "
        "`\"inductor\"`: after placement, pipelining and lowering, each run of a device's "
        "operators between transfers (one phase, one micro-batch) becomes one node of the "
        "program, compiled by Inductor at its first call (C++/OpenMP kernels on CPU, Triton on "
        "CUDA) and shared by the regions with the same code and input shapes (the micro-batches "
        "of a stage). Random and in-place operators stay op by op (dropout keeps its per-node "
        "seeding); a region Inductor cannot compile runs op by op; `print(plan)` lists the "
        "regions, what ran op by op and why. The first step pays Inductor's compile time (seconds "
        "per region on a small CPU), and planning does not yet cost the compiled kernels. See "
        "[Kernels](executor.md#kernel-regions-kernelsinductor)."),
    "measure_memory": (
        "False, or True: every executor of the step measures each device's memory, the bytes of "
        "distinct tensor storages its values hold after each instruction (Note [Measured "
        "memory]), and `plans()[-1]` shows the most each device held in any step beside the "
        "simulated peak of the programs that ran (`measured_peak_bytes`, "
        "`simulated_peak_bytes`). Over a process group each rank reports its own device. A "
        "run's temporaries and steps replayed as CUDA graphs are not seen; off, it costs a "
        "branch per instruction."),
    "trace": (
        "None or a file path (`step.json`). After every step the measured Chrome trace (forward "
        "then backward executor) is written there and the simulated one beside it "
        "(`step.simulated.json`, also for the plan `strategy=\"auto\"` chose), the folder made if "
        "missing. Over a process group one file per rank (`step.rank<r>.json`), the simulated one "
        "by rank 0. A model cut by graph breaks gets one file for the whole step (see "
        "[Traces and plots](traces.md))."),
    "strategy": (
        "`\"manual\"`: the options as given pick the plan. `\"auto\"`: the one-device plan, each "
        "placer and the pipelines (schedules x micro-batches x partitions x checkpoint modes) are "
        "simulated at each batch size's first call and the fastest that fits runs (see "
        "[Strategy search](strategy.md)); `plans()[-1].candidates` lists them. On the first "
        "steps the chosen plan is timed against the one-device plan, which is kept only when "
        "every one of its steps was faster. Its pipelines keep the `pipeline` option's defaults "
        "(training-mode batch norm deferred, with a warning when such a pipeline is chosen; "
        "dropout drawn per micro-batch). Not with `placer`; `pipeline` may then give only "
        "`batch_norm`, `allow_random`, `loss_reduction` and `portals` "
        "(`{\"batch_norm\": \"refuse\"}` keeps eager's statistics). Over a process group rank 0 "
        "measures and every rank searches on its numbers (the one-device plan left out). "
        "`mode=\"max-autotune\"` means `\"auto\"`."),
    "process_group": (
        "None or a `torch.distributed.ProcessGroup`: plan over this group's ranks (`devices`, when "
        "a count, must equal its size). None with `devices=\"world\"`: the default group."),
    "peer_timeout": (
        "Seconds (a number > 0), only with a process group: how long a rank waits for a transfer "
        "with another rank before it raises `ExecutionError` naming the rank that failed. With "
        "`kernels=\"inductor\"` it waits 600 s longer, since a peer may be compiling its regions "
        "in the step (a rank that raises is still named at once)."),
    "mesh": (
        "None, `{\"pp\": P, \"dp\": D}` or a `torch.distributed.device_mesh.DeviceMesh` with dims "
        "named `\"pp\"` and `\"dp\"`, with `devices=\"world\"`: P x D must be the world size. Each "
        "of the D data-parallel replicas runs the plan over its P ranks (a dict is laid out "
        "pipeline outermost: rank r is stage r // D of replica r % D) and every stage's gradients "
        "are averaged over its dp group by bucketed all-reduces before the backward returns them. "
        "Not with `process_group`, nor (for D > 1) with `strategy=\"auto\"` yet. See [the mesh "
        "option](distributed.md#the-mesh-option)."),
    "input_check_every": (
        "An int >= 0, over a process group: the first step of every executor over ranks compares a "
        "fingerprint of each data input (shape, dtype, 64 strided elements) over the ranks that "
        "must feed the same batch (one pipeline) and raises `ConfigError` on every rank naming the "
        "inputs and ranks that differ, before anything runs. N > 0 checks again every N steps; 0 "
        "checks the first step only."),
    "mode": (
        "torch.compile's `mode=`. `\"default\"`; `\"max-autotune\"` and "
        "`\"max-autotune-no-cudagraphs\"` mean `strategy=\"auto\"` with `devices` one CPU worker per "
        "core (torch.compile takes a mode or options, not both; with one device, or with `placer` "
        "or `pipeline` given, there is nothing to search and a warning says so); "
        "`\"reduce-overhead\"` means `cuda_graphs=True` (over a process group, which has no graph "
        "replay yet, a warning says so and the step runs by stream replay; `cuda_graphs=True` "
        "asked for by name there is a `ConfigError`)."),
}
