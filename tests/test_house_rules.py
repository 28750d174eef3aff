"""The house rules the import contracts cannot say: small functions in analytics, small modules, a light hook."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_ANALYTICS_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450
ONE_FILE_BY_DESIGN = {"collectors/hook.py"}  # the in-process hook stays one file that imports nothing heavy
NOT_PACKAGE = {"tests", "benchmarks", ".venv", "build", ".git"}


def _modules() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.py") if not (set(p.relative_to(REPO).parts) & NOT_PACKAGE))


def test_there_is_something_to_check() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _modules()}
    assert {"spine.py", "config/__init__.py", "analytics/diagnosis.py", "collectors/hook.py"} <= names


def test_every_package_is_installed() -> None:
    # pyproject lists the packages one by one (the repository root is the package): a subpackage missing
    # there is missing from a wheel or a non-editable install
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("rankscope", *p.parent.relative_to(REPO).parts)) for p in _modules() if p.name == "__init__.py"}
    assert found <= listed, sorted(found - listed)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_module_over_450_lines(path: Path) -> None:
    rel = path.relative_to(REPO).as_posix()
    n = len(path.read_text(encoding="utf-8").splitlines())
    if rel in ONE_FILE_BY_DESIGN:
        pytest.skip(f"{rel} ({n} lines) stays one file by design")
    assert n <= MAX_MODULE_LINES, f"{rel} has {n} lines; split it by role (limit {MAX_MODULE_LINES})"


def test_no_analytics_function_over_80_lines() -> None:
    long = []
    for path in _modules():
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith("analytics/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - start + 1 if node.end_lineno else 0
                if n > MAX_ANALYTICS_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these into named steps: " + "; ".join(long)


def test_importing_the_hook_loads_no_third_party_module() -> None:
    """A training process imports the hook: it must not pull in polars, pyarrow, numpy or anything else."""
    code = (
        "import sys; before = set(sys.modules); import rankscope.collectors.hook; "
        "stdlib = sys.stdlib_module_names; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(' '.join(sorted(m for m in new if m not in stdlib and m != 'rankscope' and not m.startswith('_'))))"
    )
    res = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert res.stdout.strip() == "", f"the hook imports third-party modules: {res.stdout.strip()}"


def test_library_never_imports_the_harness() -> None:
    """Belt and braces beside import-linter: only cli/demo.py names rankscope.harness."""
    users = []
    for path in _modules():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "harness":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n == "rankscope.harness" or n.startswith("rankscope.harness.") for n in names):
                users.append(rel.as_posix())
    assert sorted(set(users)) == ["cli/demo.py"]
