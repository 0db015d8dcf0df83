"""Command line: ``python -m modelpar <command>``.

Commands:
  demo   train a small transformers Llama on one device, placed and pipelined on 4 CPU
         worker devices and by strategy="auto", each checked against eager; plan
         summaries, step times, traces and a picture in modelpar-demo/ (see
         ``modelpar.demo``); --ir: the hand-written IR walk-through instead
  plan   place an IR graph on N devices, simulate the step, print the summary
         (--strategy auto: search placers and pipelines, print every candidate)
  opt    run named passes on an IR file and print the IR they leave (like mlir-opt)

Example:
  python -m modelpar plan examples/ir/mlp_step.txt --devices 2 --placer m-etf --trace step.json
  python -m modelpar plan examples/ir/skip_step_symbolic.txt --strategy auto --devices 2 --batch-size 64
  python -m modelpar opt --pass cost:devices=2 --pass place-metf:devices=2 --pass lower g.txt
  python -m modelpar opt --list

Errors of modelpar (a bad option, a graph that does not parse, a plan that
does not fit) print one line on stderr and exit with status 1.
"""
from __future__ import annotations

import argparse
import sys


def _report(command: str, e: BaseException) -> int:
    """Prints a modelpar error or an unreadable file as one line on stderr; returns 1."""
    message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if isinstance(e, OSError) and e.filename is not None:
        message = f"cannot read '{e.filename}': {e.strerror}"
    print(f"python -m modelpar {command}: error: {message}", file=sys.stderr)
    return 1


def _search(args: argparse.Namespace, memory) -> int:
    """``plan --strategy auto``: the strategy search on the graph, its table,
    then the chosen plan's summary."""
    import modelpar
    from .planning.option_names import check_one_of
    from .planning.strategy import search_strategy

    try:
        if args.batch_size is None:
            raise modelpar.ConfigError("modelpar plan: --strategy auto needs --batch-size B (the "
                                       "graph's batch symbol is costed and micro-batched at B)")
        check_one_of("plan", "batch_norm", args.batch_norm)
        s = search_strategy(args.graph, args.devices or 2, args.batch_size, machine=args.machine,
                            memory=memory, batch_norm=args.batch_norm,
                            lp_time_limit_s=args.lp_time_limit)
        plan = s.pipeline if s.pipeline is not None else s.placement
        if args.trace:
            plan.write_trace(args.trace)
    except (modelpar.Error, OSError) as e:
        return _report("plan", e)
    print(s.table(), end="")
    print(f"chosen: {s.candidates[s.chosen]['label']}")
    print(plan.summary(), end="")
    if args.trace:
        print(f"  trace: {args.trace}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    import modelpar
    from .planning.placement import plan_graph

    memory = None
    if args.memory is not None:
        parts = [m.strip() for m in args.memory.split(",")]
        memory = parts[0] if len(parts) == 1 else parts
    try:
        from .planning.option_names import check_one_of
        check_one_of("plan", "strategy", args.strategy)  # one definition: passes/option_names.h
    except modelpar.Error as e:
        return _report("plan", e)
    if args.strategy == "auto":
        return _search(args, memory)
    try:
        p = plan_graph(args.graph, devices=args.devices, memory=memory, placer=args.placer,
                       machine=args.machine, trace=args.trace, coarsen=not args.no_coarsen,
                       dump_dir=args.dump_dir, lp_time_limit_s=args.lp_time_limit)
    except (modelpar.Error, OSError) as e:
        return _report("plan", e)
    print(p.summary(), end="")
    if args.trace:
        print(f"  trace: {args.trace}")
    return 0


def _opt(args: argparse.Namespace) -> int:
    import modelpar
    from . import _C

    if args.list:
        for name, reads, help_text in _C.registered_passes():
            print(f"{name:<12} {reads:<8} {help_text}")
        return 0
    if args.ir is None or not args.passes:
        print("python -m modelpar opt: error: give an IR file and at least one --pass "
              "(--list shows the passes)", file=sys.stderr)
        return 2
    try:
        text = sys.stdin.read() if args.ir == "-" else open(args.ir, encoding="utf-8").read()
        out = _C.run_passes(text, args.passes, dump_dir=args.dump_dir, verify=not args.no_verify)
    except (modelpar.Error, OSError) as e:
        return _report("opt", e)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(out)
    else:
        print(out, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelpar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train a small transformer one device, placed, pipelined and auto on CPU",
        description="Trains a 4-layer Llama (transformers, random init, nothing downloaded) for a "
                    "few SGD steps eagerly, with modelpar on one device, placed by m-ETF and "
                    "pipelined by 1F1B on 4 CPU worker devices, and with strategy=\"auto\"; checks "
                    "each against eager, prints the plans and the step times, and writes Chrome "
                    "traces and pipeline_timeline.png into --out.")
    demo.add_argument("--out", default="modelpar-demo",
                      help="folder for the traces and the picture (the .dot files with --ir)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--steps", type=int, default=12, help="SGD steps of each run (default 12)")
    demo.add_argument("--quick", action="store_true",
                      help="a 2-layer model, eager and the pipeline only")
    demo.add_argument("--ir", action="store_true",
                      help="the IR walk-through: a hand-written 2-device Program verified and run")
    plan = sub.add_parser(
        "plan", help="place a graph on N devices and simulate the step",
        description="Runs modelpar's sequence of passes (cost, coarsen, place, lower, simulate) on an "
                    "IR graph and prints the placement summary: units per device, simulated "
                    "step time, speed-up over one device, peak memory per device, pass times.")
    plan.add_argument("graph", help="IR text file of one graph (ir/README.md)")
    plan.add_argument("--devices", type=int, default=None,
                      help="logical devices (default: the machine profile's, else 1)")
    plan.add_argument("--memory", default=None,
                      help="memory per device: a size such as 16GiB, 512MiB, 1.5GB, or a comma-"
                           "separated list with one per device (default: the profile's, else 16GiB)")
    plan.add_argument("--placer", default="m-etf", help="m-topo, m-etf (default) or m-sct")
    plan.add_argument("--trace", default=None, help="write a Chrome trace of the simulated step")
    plan.add_argument("--machine", default=None,
                      help="machine profile JSON (passes/README.md); one device is replicated")
    plan.add_argument("--no-coarsen", action="store_true",
                      help="place every node on its own instead of coarsened units")
    plan.add_argument("--dump-dir", default=None,
                      help="write the IR after every pass there (default: $MODELPAR_DUMP_DIR)")
    plan.add_argument("--lp-time-limit", type=float, default=20.0,
                      help="m-SCT's LP time limit in seconds (default 20)")
    plan.add_argument("--strategy", default="manual",
                      help="auto: search the one-device plan, the placers and the pipelines "
                           "(schedules x micro-batches x partitions x checkpoint modes) by "
                           "simulation, print every candidate and the chosen plan (needs "
                           "--batch-size; --devices defaults to 2)")
    plan.add_argument("--batch-size", type=int, default=None,
                      help="with --strategy auto: the value of the graph's batch symbol")
    plan.add_argument("--batch-norm", default="refuse",
                      help="with --strategy auto: training-mode batch norm in pipelines")
    opt = sub.add_parser(
        "opt", help="run named passes on an IR file and print the IR they leave",
        description="Runs passes by name, in order, on an IR graph or program (ir/README.md), "
                    "verifying the IR after each, and prints the IR the last one leaves. A pass "
                    "is NAME or NAME:key=value,key=value; --list shows them.")
    opt.add_argument("ir", nargs="?", help="IR text file ('-' reads standard input)")
    opt.add_argument("--pass", dest="passes", action="append", default=[],
                     help="a pass to run, e.g. cost:devices=2 (repeat for more)")
    opt.add_argument("--list", action="store_true", help="list the passes and their options")
    opt.add_argument("-o", "--output", default=None, help="write the IR there instead of stdout")
    opt.add_argument("--dump-dir", default=None,
                     help="write the IR after every pass there (default: $MODELPAR_DUMP_DIR)")
    opt.add_argument("--no-verify", action="store_true",
                     help="do not verify the IR after each pass")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo, run_ir_demo
        if args.ir:
            return run_ir_demo(out_dir=args.out, seed=args.seed)
        return run_demo(out_dir=args.out, steps=args.steps, quick=args.quick, seed=args.seed)
    if args.command == "plan":
        return _plan(args)
    if args.command == "opt":
        return _opt(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
