"""The import graph of our packages, read with `ast` (nothing is imported): no circles, floors that hold, small modules.

The direction (docs/code_tour.md): scripts -> stages -> data (data_gen, pretrain's library) -> align core -> rewards.
A module may import its own floor or any floor below; `rewards` imports nothing of ours but itself; no stage imports
another stage's module (the shared steps live in align/stage.py, the pipeline runs stages as subprocesses).
Imports inside functions and `importlib.import_module("...")` with a literal name count as edges too, so a lazy
import cannot hide an edge that points up.

Run: pytest tests/test_import_graph.py -q   (about a second)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("align", "pretrain", "rewards", "data_gen")

# The stages: each runs one job from a recipe (and the modules that belong to exactly one of them).
STAGES = {
    "align.stage",  # the steps every post-training stage shares
    "align.sft",
    "align.preference", "align.preference_rounds",
    "align.grpo", "align.grpo_data", "align.async_grpo",
    "align.distill", "align.distill.config", "align.distill.loss", "align.distill.metrics", "align.distill.teacher",
    "align.distill.rejection", "align.distill.held_out", "align.distill.trainer", "align.distill.rounds",
    "align.evaluate",
    "align.merge",
    "align.pipeline", "align.pipeline_plan", "align.report", "align.compare", "align.ablation", "align.ablation_report",
    "pretrain.train",
}
# Modules of one stage that another stage must not import (align.stage is shared: every stage imports it).
STAGE_OWNERS = {
    "align.sft": "sft", "align.preference": "preference", "align.preference_rounds": "preference",
    "align.grpo": "grpo", "align.grpo_data": "grpo", "align.async_grpo": "grpo",
    "align.distill": "distill", "align.distill.config": "distill", "align.distill.loss": "distill",
    "align.distill.metrics": "distill", "align.distill.teacher": "distill", "align.distill.trainer": "distill",
    "align.distill.rejection": "distill", "align.distill.held_out": "distill", "align.distill.rounds": "distill",
    "align.evaluate": "evaluate",
    "align.merge": "merge", "align.pipeline": "pipeline", "align.pipeline_plan": "pipeline", "align.report": "pipeline",
    "align.compare": "pipeline", "align.ablation": "pipeline", "align.ablation_report": "pipeline",
    "pretrain.train": "pretrain",
}
FLOORS = {"rewards": 0, "core": 1, "data": 2, "stage": 3}
MAX_LINES = {"library": 500, "script": 150}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def floor(module: str) -> int:
    top = module.split(".")[0]
    if top == "rewards":
        return FLOORS["rewards"]
    if module in STAGES:
        return FLOORS["stage"]
    if top == "data_gen" or top == "pretrain":
        return FLOORS["data"]
    return FLOORS["core"]


def _ours(name: str) -> str | None:
    """The module of ours that `name` (a module or a module.attribute) lands in, or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> dict[str, int]:
    """{module of ours it imports: first line}, from every import statement (top level or not)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")):
            names = [node.args[0].value]
        for name in names:
            target = _ours(name)
            if target and target != module:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_the_graph_is_read():
    assert {"align.sft", "align.data", "rewards", "data_gen.tasks", "pretrain.train"} <= set(GRAPH)
    assert "align.data" in GRAPH["align.sft"] or "align.stage" in GRAPH["align.sft"]


def test_no_import_circles():
    """Tarjan's strongly connected components: every component is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_floors_point_down():
    """rewards <- align core <- data (data_gen, pretrain's library) <- stages: nothing imports a floor above its own."""
    up = [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)}) at line {line}"
          for m, targets in GRAPH.items() for t, line in targets.items() if floor(t) > floor(m)]
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_rewards_import_nothing_of_ours_but_rewards():
    out = [f"{m} imports {t}" for m, targets in GRAPH.items() if m.startswith("rewards")
           for t in targets if not t.startswith("rewards")]
    assert not out, out


def test_the_core_never_imports_data_gen_or_a_stage():
    out = [f"{m} imports {t}" for m, targets in GRAPH.items() if floor(m) == FLOORS["core"]
           for t in targets if t.startswith("data_gen") or t in STAGES]
    assert not out, out


def test_no_stage_imports_another_stage():
    out = [f"{m} imports {t}" for m, targets in GRAPH.items() if m in STAGE_OWNERS
           for t in targets if t in STAGE_OWNERS and STAGE_OWNERS[t] != STAGE_OWNERS[m]]
    assert not out, out


def test_our_imports_are_at_the_top_of_each_file():
    """An import of our own inside a function hides an edge of the graph from a reader (heavy optional packages such
    as vllm, deepspeed or mergekit may still be imported where they are needed)."""
    inner = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0:
                name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if getattr(node, "level", 0) or (name and name.split(".")[0] in PACKAGES):
                    inner.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not inner, "imports of our own modules inside functions:\n" + "\n".join(inner)


def _length(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_library_modules_stay_small():
    long = {str(p.relative_to(ROOT)): _length(p) for p in MODULES.values() if _length(p) > MAX_LINES["library"]}
    assert not long, f"library modules over {MAX_LINES['library']} lines (split them along a seam): {long}"


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_scripts_stay_thin(path):
    assert _length(path) <= MAX_LINES["script"], f"{path.name}: {_length(path)} lines > {MAX_LINES['script']}"


def test_no_script_is_named_like_a_package():
    """`python scripts/x.py` puts scripts/ first on sys.path: a scripts/pretrain.py would shadow the package."""
    clash = [p.name for p in (ROOT / "scripts").glob("*.py") if p.stem in PACKAGES]
    assert not clash, clash
