"""The Python package's house rules, checked on its source: no import cycle
between its modules (lazy imports inside functions count), no import of
another module's private name, a public API of at most 30 names, each
documented, and the old top-level names still working with a warning."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

import modelpar

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "modelpar"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the source package (a
    package's ``__init__.py`` under the package's own name)."""
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(module imported, name imported from it, line) for every ``from``
    import in the file, wherever it is (module level or in a function);
    relative imports resolved against the module's package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                out.append((target, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out.append((alias.name, "", node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, imported, _ in _imports(name, path, mods):
            if imported == "_C":  # the extension module: a leaf
                continue
            for candidate in (f"{target}.{imported}", target):
                if candidate in mods and candidate != name:
                    graph[name].add(candidate)
                    break
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_subpackages_and_no_import_cycle() -> None:
    graph = _graph()
    assert {"modelpar.compile.backend", "modelpar.planning.options", "modelpar.profiles.cpu",
            "modelpar.distributed.rank_executor", "modelpar.runtime.executor"} <= set(graph)
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_name() -> None:
    mods = _modules()
    bad = []
    for name, path in mods.items():
        for target, imported, line in _imports(name, path, mods):
            if target in mods and imported.startswith("_") and imported != "_C" \
                    and not imported.startswith("__"):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported} "
                           f"from {target}")
    assert not bad, "\n".join(bad)


def test_every_subpackage_and_module_says_what_it_holds() -> None:
    missing = [str(p.relative_to(PACKAGE.parent)) for p in _modules().values()
               if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not missing, f"modules without a docstring: {missing}"


def test_the_public_api_is_small_and_documented() -> None:
    assert len(modelpar.__all__) <= 30
    assert len(set(modelpar.__all__)) == len(modelpar.__all__)
    undocumented = []
    for name in modelpar.__all__:
        obj = getattr(modelpar, name)
        doc = vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__
        if not (doc or "").strip():
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_old_top_level_names_warn_and_name_their_new_home() -> None:
    from modelpar.ir import load_graph
    from modelpar.planning.options import resolve_options
    with pytest.warns(DeprecationWarning, match=r"modelpar\.ir\.load_graph"):
        assert modelpar.load_graph is load_graph
    with pytest.warns(DeprecationWarning, match=r"modelpar\.planning\.options\.resolve_options"):
        assert modelpar.resolve_options is resolve_options
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        modelpar.not_a_name  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert modelpar.plan_graph is modelpar.planning.placement.plan_graph  # current: no warning


def test_renamed_names_warn_and_name_their_new_spelling() -> None:
    """Names that meant two things were renamed; the old spellings still work
    for one release, at the top level and in their modules."""
    from modelpar.compile.records import PlanRecord
    from modelpar.planning.placement import JointPlacement
    from modelpar.runtime.executor import cuda_graph_issues
    renamed = [(modelpar, "Plan", r"modelpar\.compile\.records\.PlanRecord", PlanRecord),
               (modelpar.compile.records, "Plan", r"modelpar\.compile\.records\.PlanRecord", PlanRecord),
               (modelpar, "CapturedPlacement", r"modelpar\.planning\.placement\.JointPlacement",
                JointPlacement),
               (modelpar.planning.placement, "CapturedPlacement",
                r"modelpar\.planning\.placement\.JointPlacement", JointPlacement),
               (modelpar, "capture_issues", r"modelpar\.runtime\.executor\.cuda_graph_issues",
                cuda_graph_issues),
               (modelpar.runtime.executor, "capture_issues",
                r"modelpar\.runtime\.executor\.cuda_graph_issues", cuda_graph_issues),
               (modelpar.device, "DevicePlan", r"modelpar\.device\.DevicePlanRecord",
                modelpar.device.DevicePlanRecord)]
    for module, old, new, obj in renamed:
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(module, old) is obj
    with pytest.raises(AttributeError, match="has no attribute 'Plans'"):
        modelpar.compile.records.Plans  # noqa: B018
