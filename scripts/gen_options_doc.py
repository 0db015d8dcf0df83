"""Writes the torch.compile options reference (docs/options.md's tables) from
the one option definition, so that the page cannot drift from the code:

- the keys and their defaults: ``modelpar.planning.options.CompileOptions``
  (the dataclass ``resolve_options`` fills) and ``pipeline_options({})``;
- the valid names: ``modelpar.planning.option_names`` (read from C++,
  passes/option_names.h) and ``options.VALID_MODES``;
- what each does: ``modelpar.planning.option_docs.OPTION_DOCS``.

A key without an entry in OPTION_DOCS, or an entry that names no key, is an
error. The mkdocs hook docs/hooks/modelpar_docs.py calls ``render()`` at every
build; by hand:

    PYTHONPATH=build/python .venv/bin/python scripts/gen_options_doc.py   # prints the tables
"""
from __future__ import annotations

import dataclasses
import sys
import typing


def _code(value: object) -> str:
    return f"`{value!r}`"


def _names() -> dict[str, tuple[str, ...]]:
    """Options whose values are a fixed list of names -> those names."""
    from modelpar.planning import option_names as n
    from modelpar.planning.options import VALID_MODES
    return {"placer": n.PLACERS, "strategy": n.STRATEGIES, "mode": VALID_MODES,
            "pipeline.schedule": n.PIPELINE_SCHEDULES,
            "pipeline.partition": n.PARTITION_METHODS,
            "pipeline.checkpoint": n.CHECKPOINT_MODES,
            "pipeline.batch_norm": n.BATCH_NORM_MODES,
            "pipeline.loss_reduction": n.LOSS_REDUCTIONS}


def option_rows() -> list[tuple[str, str, str, str]]:
    """(key, valid values, default, description) for every option, in the
    order of CompileOptions' fields, the pipeline keys after ``pipeline``,
    ``mode`` last.

    Raises:
        SystemExit: a key without a description or a description of no key.
    """
    from modelpar.planning import option_names, options
    from modelpar.planning.option_docs import OPTION_DOCS

    names = _names()
    hints = typing.get_type_hints(options.CompileOptions)
    # The fields resolve_options fills from the user's keys (the others are
    # derived: world, pipeline_given, dp_group; mode is torch.compile's own argument).
    keys = [f for f in dataclasses.fields(options.CompileOptions)
            if f.name not in ("world", "pipeline_given", "mode", "dp_group")]
    pipeline_defaults = options.pipeline_options({})
    rows: list[tuple[str, str, str, str]] = []

    def add(key: str, values: str, default: str) -> None:
        rows.append((key, values, default, OPTION_DOCS.get(key, "")))

    for f in keys:
        if f.name in names:
            values = ", ".join(map(_code, names[f.name]))
            if f.default is None:
                values = "`None`, " + values
        elif f.name == "devices":
            values = (f"int from 1 to {option_names.MAX_DEVICES}, "
                      + ", ".join(map(_code, option_names.DEVICE_WORDS)))
        else:
            values = _type_name(hints[f.name])
            values = values if values == "see right" else f"`{values}`"
        add(f.name, values, _code(f.default))
        if f.name == "pipeline":
            for k, v in pipeline_defaults.items():
                key = f"pipeline.{k}"
                vals = (", ".join(map(_code, names[key])) if key in names
                        else f"`{type(v).__name__}`")
                add(key, vals, _code(v))
    add("mode", ", ".join(map(_code, names["mode"])), _code("default"))

    described = {r[0] for r in rows}
    missing = [r[0] for r in rows if not r[3]]
    stale = sorted(set(OPTION_DOCS) - described)
    if missing or stale:
        raise SystemExit("gen_options_doc: modelpar/planning/option_docs.py is out of step with "
                         f"the options: no description for {missing or 'none'}; descriptions of "
                         f"no option: {stale or 'none'}")
    return rows


def _type_name(hint: object) -> str:
    """``str | None`` -> ``str or None`` (a ``|`` would split a table cell);
    ``Any`` -> ``see right`` (the description lists what is taken)."""
    if hint is typing.Any:
        return "see right"
    args = typing.get_args(hint)
    if args and type(None) in args:
        return " or ".join(_type_name(a) for a in args)
    if hint is type(None):
        return "None"
    name = getattr(hint, "__name__", None) or str(hint)
    return name.replace("typing.", "").replace("collections.abc.", "")


def render() -> str:
    """The options reference as Markdown tables."""
    rows = option_rows()

    def table(selected: list[tuple[str, str, str, str]]) -> str:
        out = ["| key | values | default | what it does |", "|---|---|---|---|"]
        for key, values, default, doc in selected:
            out.append(f"| `{key}` | {values} | {default} | {doc} |")
        return "\n".join(out) + "\n"

    top = [r for r in rows if not r[0].startswith("pipeline.") and r[0] != "mode"]
    pipe = [r for r in rows if r[0].startswith("pipeline.")]
    mode = [r for r in rows if r[0] == "mode"]
    return ("## `options={...}`\n\n" + table(top)
            + "\n## The `pipeline` dict\n\n" + table(pipe)
            + "\n## `mode=`\n\n" + table(mode))


if __name__ == "__main__":
    sys.stdout.write(render())
