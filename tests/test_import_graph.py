"""The import graph of our packages, read with `ast` (nothing is imported): no circles, floors that hold, thin scripts.

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

# The stages: each runs one job from a recipe. A stage is a package of align/ (every module in it belongs to that
# stage), or one module (the eval suite, pretraining's loop). align.stage holds the steps every stage shares.
STAGE_PACKAGES = {
    "align.sft": "sft",
    "align.preference": "preference",
    "align.grpo": "grpo",
    "align.distill": "distill",
    "align.pipeline": "pipeline",
}
STAGE_MODULES = {"align.stage": None, "align.eval.suite": "evaluate", "pretrain.train": "pretrain"}
FLOORS = {"rewards": 0, "core": 1, "data": 2, "stage": 3}
MAX_SCRIPT_LINES = 150


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def stage_of(module: str) -> str | None | bool:
    """The stage a module belongs to (None: shared by every stage), or False for a module of no stage."""
    for package, stage in STAGE_PACKAGES.items():
        if module == package or module.startswith(package + "."):
            return stage
    return STAGE_MODULES.get(module, False)


def floor(module: str) -> int:
    top = module.split(".")[0]
    if top == "rewards":
        return FLOORS["rewards"]
    if stage_of(module) is not False:
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
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")
        ):
            names = [node.args[0].value]
        for name in names:
            target = _ours(name)
            if target and target != module:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_the_graph_is_read():
    assert {"align.sft.trainer", "align.data.loading", "rewards", "data_gen.tasks", "pretrain.train"} <= set(GRAPH)
    assert "align.data.loading" in GRAPH["align.sft.trainer"] or "align.stage" in GRAPH["align.sft.trainer"]


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
    """rewards <- align core <- data (data_gen, pretrain's library) <- stages: nothing imports a floor above its
    own."""
    up = [
        f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)}) at line {line}"
        for m, targets in GRAPH.items()
        for t, line in targets.items()
        if floor(t) > floor(m)
    ]
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_the_command_registry_is_core_and_imports_no_stage():
    """align/commands.py names every stage, by its script's file (it runs scripts/<x>.py with runpy), never by an
    import: it stays on the core floor, so any module may use it (scripts/preflight.py, the pipeline) and
    `smolalign --help` or `smolalign recipes` imports no trainer."""
    assert floor("align.commands") == FLOORS["core"]
    assert not [t for t in GRAPH["align.commands"] if stage_of(t) is not False or t.startswith("data_gen")]


def test_rewards_import_nothing_of_ours_but_rewards():
    out = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if m.startswith("rewards")
        for t in targets
        if not t.startswith("rewards")
    ]
    assert not out, out


def test_the_core_never_imports_data_gen_or_a_stage():
    out = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if floor(m) == FLOORS["core"]
        for t in targets
        if t.startswith("data_gen") or stage_of(t) is not False
    ]
    assert not out, out


def test_no_stage_imports_another_stage():
    out = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if stage_of(m)
        for t in targets
        if stage_of(t) and stage_of(t) != stage_of(m)
    ]
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


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_scripts_stay_thin(path):
    assert _length(path) <= MAX_SCRIPT_LINES, f"{path.name}: {_length(path)} lines > {MAX_SCRIPT_LINES}"


def test_no_script_is_named_like_a_package():
    """`python scripts/x.py` puts scripts/ first on sys.path: a scripts/pretrain.py would shadow the package."""
    clash = [p.name for p in (ROOT / "scripts").glob("*.py") if p.stem in PACKAGES]
    assert not clash, clash
