"""MkDocs hooks of the modelpar manual (mkdocs.yml's ``hooks:``).

1. The options reference: the marker ``<!-- generated: options -->`` in
   docs/options.md is replaced by scripts/gen_options_doc.py's tables, made
   from the option definition at every build (needs the built package on
   PYTHONPATH, as scripts/docs.sh sets it).
2. Stale references fail the build. A warning (an error under ``mkdocs build
   --strict``) for every
   - inline code span naming a file of this repository that does not exist
     (``passes/place/place_metf.cpp``, ``compile/pipeline_step.py`` below
     python/modelpar/, a bare ``fx_import.py``);
   - ``Note [Title]`` that no source file defines;
   - ``modelpar.name.name`` that does not resolve in the built package, or
     resolves only through a deprecated alias;
   - ``test_file.py::test_name`` or `` `Suite.Name` `` that names no test.
   MkDocs itself checks the links between pages and their anchors;
   mkdocstrings, the API page's objects and their documented parameters.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.modelpar")
ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- generated: options -->"
# Pages about other projects' code, whose file names are theirs.
_NOT_OUR_FILES = {"design/algorithms.md"}

# A path is checked when its first part is one of these (top-level folders,
# the Python package and its subpackages, passes/' groups); anything else in
# a code span (`step.json`, `~/.cache/...`, `build/...`) is the user's.
_TOP = {"ir", "passes", "runtime", "capture", "backend", "include", "python", "tests",
        "examples", "bench", "scripts", "docs", "modelpar", "compile", "planning", "profiles",
        "distributed", "device", "cost", "place", "pipeline", "lower", "search", ".ci"}
# Where a path may be relative to: the root, the package, passes/, include/.
_BASES = ("", "python/", "python/modelpar/", "passes/", "include/")
_SOURCE_SUFFIXES = (".py", ".cpp", ".h", ".cu", ".cmake", ".txt", ".sh")
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_FENCE = re.compile(r"^( *)(```|~~~).*?^\1\2", re.M | re.S)
_NOTE = re.compile(r"Note\s+\[([^\]]+)\]")
_PATHLIKE = re.compile(r"[A-Za-z0-9_.*/-]+")
_PYTEST = re.compile(r"(?:tests/python/)?(test_\w+\.py)::(\w+)")
_GTEST = re.compile(r"`([A-Z]\w+)\.([A-Z]\w+)`")
_PYNAME = re.compile(r"(?<![\w/.])modelpar(?:\.[A-Za-z_]\w*)+")


def _gen_options():
    spec = importlib.util.spec_from_file_location("gen_options_doc",
                                                  ROOT / "scripts" / "gen_options_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _basenames() -> frozenset[str]:
    return frozenset(p.name for p in _source_files())


@functools.lru_cache(maxsize=None)
def _source_files() -> tuple[Path, ...]:
    """Every file of the checkout, without build folders, the venv, the
    built site and git's own."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        if Path(folder) == ROOT:
            dirs[:] = [d for d in dirs if d not in {".git", ".venv", "site"}
                       and not d.startswith("build")]
        dirs[:] = [d for d in dirs if d not in {"__pycache__", ".pytest_cache"}]
        out.extend(Path(folder, f) for f in files)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _notes() -> str:
    """Every source file's text with comment markers and line breaks folded
    into single spaces, so a note title wrapped over comment lines matches."""
    parts = []
    for p in _source_files():
        if p.suffix not in (".py", ".cpp", ".h", ".cu", ".cmake"):
            continue
        text = p.read_text(errors="replace")
        text = re.sub(r"\n[ \t]*(//+|#+|\*)?[ \t]*", " ", text)
        parts.append(re.sub(r"\s+", " ", text))
    return "\n".join(parts)


def _path_exists(path: str) -> bool:
    if "/" not in path:
        return path in _basenames()
    for base in _BASES:
        candidate = base + path
        if any(ch in candidate for ch in "*?"):
            if list(ROOT.glob(candidate)):
                return True
        elif (ROOT / candidate).exists():
            return True
    return False


@functools.lru_cache(maxsize=None)
def _gtests() -> frozenset[str]:
    """``Suite.Name`` of every GoogleTest test in tests/, and of every ctest
    test added by name (``add_test(NAME Suite.Name ...)``)."""
    found = {"Suite.Name"}  # how errors.md spells the pattern
    for p in _source_files():
        if p.name == "CMakeLists.txt":
            found.update(re.findall(r"add_test\(\s*NAME\s+([\w.]+)", p.read_text()))
    for p in _source_files():
        if p.suffix != ".cpp" or p.relative_to(ROOT).parts[0] != "tests":
            continue
        text = p.read_text(errors="replace")
        for suite, name in re.findall(r"\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", text):
            found.add(f"{suite}.{name}")
    return frozenset(found)


@functools.lru_cache(maxsize=None)
def _python_name_problem(name: str) -> str | None:
    """Why ``name`` (``modelpar.ir.load_graph``) is not a current name of the
    package, or None when it is."""
    import importlib
    import warnings
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 - any import failure is the answer
            return f"importing {'.'.join(parts[:i])} fails: {e}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
        except DeprecationWarning as e:
            return f"it is a deprecated alias ({e})"
        except AttributeError:
            return "no such name"
        return None
    return "no such module"


def _check_references(markdown: str, where: str) -> None:
    for suite, name in sorted(set(_GTEST.findall(markdown))):
        if f"{suite}.{name}" not in _gtests():
            log.warning("%s: no C++ test %s.%s in tests/", where, suite, name)
    for file, test in sorted(set(_PYTEST.findall(markdown))):
        path = ROOT / "tests" / "python" / file
        if not path.exists():
            log.warning("%s: tests/python/%s does not exist", where, file)
        elif not re.search(rf"^\s*(async )?def {re.escape(test)}\b", path.read_text(), re.M):
            log.warning("%s: %s has no test %s", where, file, test)
    for name in sorted(set(_PYNAME.findall(markdown))):
        if name.endswith((".h", ".py", ".cpp")) or ".." in name:
            continue
        problem = _python_name_problem(name)
        if problem:
            log.warning("%s: `%s` is not a current name of the package: %s", where, name, problem)
    prose = _FENCE.sub("", markdown)
    for span in _SPAN.findall(prose):
        path = span.strip()
        if not _PATHLIKE.fullmatch(path) or "<" in path or path.startswith(("-", ".")):
            continue
        parts = path.rstrip("/").split("/")
        if "/" in path and parts[0] in _TOP:
            if not _path_exists(path):
                log.warning("%s: `%s` names a file or folder this repository does not have", where,
                            path)
        elif len(parts) == 1 and path.endswith(_SOURCE_SUFFIXES) and not _path_exists(path):
            log.warning("%s: `%s` names a source file this repository does not have", where, path)
    notes = _notes()
    for title in _NOTE.findall(markdown):
        title = re.sub(r"\s+", " ", title).strip()
        if title != "..." and f"Note [{title}]" not in notes:
            log.warning("%s: Note [%s] is cited but no source file defines it", where, title)


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, _gen_options().render())
    if where not in _NOT_OUR_FILES:
        _check_references(markdown, where)
    return markdown
