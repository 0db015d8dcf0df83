"""Command line: ``python -m modelpar <command>``.

Commands:
  demo   run the hand-written 2-device pipeline example (see ``modelpar.demo``)
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelpar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the 2-device pipelined MLP training step on CPU")
    demo.add_argument("--out", default="modelpar-demo", help="folder for the .dot files")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from modelpar.demo import run_demo
        return run_demo(out_dir=args.out, seed=args.seed)
    return 2


if __name__ == "__main__":
    sys.exit(main())
