"""The package's layers, checked on every module's imports (top-level and inside functions).

    core  <-  data  <-  client, model, tiny, models  <-  stages  <-  cli, demo, engines

- A module may import its own package and any lower layer, never a higher one.
- A stage (plan, audit, bench, generate, tokenize, train, evaluate, export, serve) never imports
  another stage: what two stages share moves down a layer (usually to `draftsmith.data`). Each
  stage's own `<stage>/cli.py` is part of that stage.
- `draftsmith.cli` and `draftsmith.demo` compose stages (the CLI wires tokenize's post-write audit
  gate, the demo runs every stage).
- `tiny` builds the tiny target model and synthetic prompts for tests and the demo: a model-layer
  helper. `models` fetches real pretrained targets (and converts GGUF files) for users, tests and
  the demo: a model-layer helper beside `tiny`. `engines` installs and launches real serving
  engines: a top-level dev tool that nothing in the package imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "draftsmith"
STAGES = {"plan", "audit", "bench", "generate", "tokenize", "train", "evaluate", "export", "serve", "check", "status"}
RANK = {
    "core": 0,
    "data": 1,
    "client": 2, "model": 2, "tiny": 2, "models": 2,
    **{stage: 3 for stage in STAGES},
    "cli": 4, "demo": 4, "gates": 4, "datacurve": 4, "engines": 4, "__main__": 4, "__init__": 4,
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    package_parts = ("draftsmith", *path.relative_to(PACKAGE).parent.parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("draftsmith")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package_parts[: len(package_parts) - node.level + 1]
                module = ".".join((*base, node.module) if node.module else base)
            else:
                module = node.module or ""
            if module.startswith("draftsmith"):
                names = [f"{module}.{alias.name}" for alias in node.names] if module == "draftsmith" else [module]
                found += [(node.lineno, name) for name in names]
    return found


def _unit(relative: Path) -> str:
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def layering_violations() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        source = _unit(relative)
        for line, module in _imports(path):
            parts = module.split(".")
            if len(parts) < 2:
                continue
            target = parts[1]
            if target == source or target not in RANK:
                continue
            where = f"draftsmith/{relative.as_posix()}:{line} imports {module}"
            if source in STAGES and target in STAGES:
                problems.append(f"{where}: a stage imports another stage (move what they share down a layer)")
            elif RANK[target] > RANK[source]:
                problems.append(f"{where}: {source} (layer {RANK[source]}) imports the higher layer {target} ({RANK[target]})")
            elif target == "engines" and source != "engines":
                problems.append(f"{where}: engines is a dev tool; the package must not depend on it")
    return problems


def test_every_package_has_a_layer():
    units = {_unit(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
    assert units - set(RANK) == set(), "give new packages a layer in RANK (and document it above)"


def test_no_module_imports_a_higher_layer_or_another_stage():
    assert layering_violations() == []


def test_the_checker_catches_a_stage_importing_a_stage(tmp_path, monkeypatch):
    fake = tmp_path / "draftsmith"
    (fake / "bench").mkdir(parents=True)
    (fake / "core").mkdir()
    (fake / "bench" / "x.py").write_text("def f():\n    from draftsmith.generate.pipeline import generate\n")
    (fake / "core" / "y.py").write_text("from ..model import io\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    problems = layering_violations()
    assert any("bench/x.py:2 imports draftsmith.generate.pipeline: a stage imports another stage" in p for p in problems)
    assert any("core/y.py:1 imports draftsmith.model:" in p and "higher layer" in p for p in problems)


def _module_of(name: str) -> Path | None:
    """The file a dotted `draftsmith...` name loads: a module, a package's __init__, or None."""
    relative = Path(*name.split(".")[1:])
    if (PACKAGE / relative).with_suffix(".py").is_file():
        return (PACKAGE / relative).with_suffix(".py")
    if (PACKAGE / relative / "__init__.py").is_file():
        return PACKAGE / relative / "__init__.py"
    return None


def _imported_names(path: Path) -> list[list[str]]:
    """Per imported name, the dotted names it may load, most specific first (`from a import b`: a.b, a)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package_parts = ("draftsmith", *path.relative_to(PACKAGE).parent.parts)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                module = ".".join((*base, node.module) if node.module else base)
            else:
                module = node.module or ""
            found += [[f"{module}.{alias.name}", module] for alias in node.names]
    return [names for names in found if names[0].startswith("draftsmith")]


def _import_graph() -> dict[Path, set[Path]]:
    """Module -> the modules it imports (top-level and inside functions); `from pkg import name` of a
    submodule counts as importing the submodule, of anything else as importing the package."""
    graph: dict[Path, set[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        edges = set()
        for candidates in _imported_names(path):
            target = next((found for name in candidates if (found := _module_of(name)) is not None), None)
            if target is not None and target != path:
                edges.add(target)
        graph[path] = edges
    return graph


def import_circles() -> list[str]:
    """Every strongly connected group of two or more modules, as `a -> b -> ... -> a` (Tarjan)."""
    graph = _import_graph()
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    circles: list[str] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in sorted(graph.get(node, ())):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                names = sorted(member.relative_to(PACKAGE).as_posix() for member in group)
                circles.append(" <-> ".join(names))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circles():
    assert import_circles() == []


def test_the_checker_catches_an_import_circle(tmp_path, monkeypatch):
    fake = tmp_path / "draftsmith"
    (fake / "audit").mkdir(parents=True)
    (fake / "audit" / "render.py").write_text("from draftsmith.audit.report import _pct\n")
    (fake / "audit" / "report.py").write_text("def f():\n    from draftsmith.audit import render\n")
    (fake / "audit" / "plain.py").write_text("from draftsmith.audit.report import f\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert import_circles() == ["audit/render.py <-> audit/report.py"]
