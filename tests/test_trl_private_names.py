"""The private names of TRL and transformers that our trainers override or read, checked against the installed
libraries.

Each module that overrides a private method of a TRL (or transformers) trainer declares every private name it
touches, in one place: `TRL_PRIVATE_METHODS` ({name: the parameters we rely on}) and `TRL_PRIVATE_ATTRIBUTES`.
This test fails in one readable place when an upgrade renames, removes or reshapes one of them, and when our code
starts to touch a private name it does not declare:

- every declared method exists on the base class with the declared parameters (names and defaults, in order);
- every declared attribute is still assigned or read by the base class's own code;
- every private name of the base (a method it defines or an attribute it assigns) that our modules touch
  (`self._x`, `trainer._x`, `super()._x`, or a method of ours named like one of the base's) is declared;
- a private method of the base is overridden only in the declaring module (one per trainer).

Run: pytest tests/test_trl_private_names.py -q   (a few seconds: imports only)
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bases():
    import transformers
    import trl
    from trl.experimental.gold import GOLDTrainer

    # the declaring module, the base class its names belong to, and the files whose code touches that base
    return [
        ("align.sft.trainer", trl.SFTTrainer, ["align/sft"]),
        ("align.grpo.trainer", trl.GRPOTrainer, ["align/grpo", "align/tools/grpo.py"]),
        ("align.distill.trainer", GOLDTrainer, ["align/distill", "align/tools/distill.py"]),
        ("align.runtime.checkpoint", transformers.Trainer, ["align/runtime/checkpoint.py", "align/stage.py"]),
        ("align.runtime.nonfinite", transformers.Trainer, ["align/runtime/nonfinite.py"]),
    ]


def parameters(func) -> str:
    """A method's parameters as we rely on them: names and defaults, in order, without annotations."""
    out = []
    for p in inspect.signature(func).parameters.values():
        star = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        out.append(star + p.name + ("" if p.default is p.empty else f"={p.default!r}"))
    return "(" + ", ".join(out) + ")"


def base_private_names(base: type) -> set[str]:
    """The private names a base class (and its bases in TRL and transformers) defines or assigns."""
    names: set[str] = set()
    for cls in base.__mro__:
        if not cls.__module__.startswith(("trl", "transformers")):
            continue
        names |= {n for n in vars(cls) if n.startswith("_") and not n.startswith("__")}
        try:
            names |= set(re.findall(r"self\.(_[a-z]\w*)\s*(?::[^=\n]*)?=(?!=)", inspect.getsource(cls)))
        except (OSError, TypeError):
            pass
    return names


def base_source(base: type) -> str:
    out = []
    for cls in base.__mro__:
        if cls.__module__.startswith(("trl", "transformers")):
            try:
                out.append(inspect.getsource(cls))
            except (OSError, TypeError):
                pass
    return "\n".join(out)


def our_code(paths: list[str]) -> dict[str, str]:
    files = []
    for p in paths:
        path = ROOT / p
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


CASES = [
    pytest.param(i, id=name)
    for i, name in enumerate(["sft", "grpo", "distill", "trainer checkpoints", "trainer non-finite guard"])
]


@pytest.mark.parametrize("case", CASES)
def test_declared_private_methods_match_the_installed_library(case):
    module_name, base, _ = _bases()[case]
    module = importlib.import_module(module_name)
    declared = getattr(module, "TRL_PRIVATE_METHODS", {})
    wrong = []
    for name, params in declared.items():
        if not hasattr(base, name):
            wrong.append(f"{base.__name__}.{name} no longer exists")
        elif parameters(getattr(base, name)) != params:
            wrong.append(f"{base.__name__}.{name}{parameters(getattr(base, name))}, declared {params}")
    assert not wrong, f"{module_name} overrides private names that changed in the installed library: {wrong}"


@pytest.mark.parametrize("case", CASES)
def test_declared_private_attributes_are_still_the_librarys(case):
    module_name, base, _ = _bases()[case]
    module = importlib.import_module(module_name)
    source = base_source(base)
    names = [*getattr(module, "TRL_PRIVATE_ATTRIBUTES", ()), *getattr(module, "TRL_FLAGS", {})]
    gone = [a for a in names if not re.search(rf"\bself\.{a}\b", source)]
    assert not gone, f"{module_name} reads attributes {base.__name__}'s code no longer has: {gone}"


@pytest.mark.parametrize("case", CASES)
def test_every_private_name_we_touch_is_declared(case):
    module_name, base, paths = _bases()[case]
    module = importlib.import_module(module_name)
    declared = set(getattr(module, "TRL_PRIVATE_METHODS", {})) | set(getattr(module, "TRL_PRIVATE_ATTRIBUTES", ()))
    private = base_private_names(base)
    touched: dict[str, str] = {}
    for path, text in our_code(paths).items():
        for m in re.finditer(
            r"(?:\bself|\btrainer|\bsuper\(\))\.(_[a-z]\w*)\b|^\s+def (_[a-z]\w*)\(\s*self", text, re.M
        ):
            name = m.group(1) or m.group(2)
            if name in private:
                touched.setdefault(name, f"{path}:{text.count(chr(10), 0, m.start()) + 1}")
    undeclared = {n: where for n, where in touched.items() if n not in declared}
    assert not undeclared, (
        f"private names of {base.__name__} touched but not declared in {module_name}'s "
        f"TRL_PRIVATE_METHODS / TRL_PRIVATE_ATTRIBUTES: {undeclared}"
    )


@pytest.mark.parametrize("case", CASES)
def test_private_overrides_live_in_the_declaring_module(case):
    """A private method of the base is overridden in one module per trainer (the one that declares it), so that an
    upgrade of the library is checked in one place; the parts the trainer is built from offer plain methods."""
    module_name, base, paths = _bases()[case]
    private = base_private_names(base)
    home = module_name.replace(".", "/") + ".py"
    elsewhere = {
        f"{path}: {m.group(1)}"
        for path, text in our_code(paths).items()
        if path != home
        for m in re.finditer(r"^\s+def (_[a-z]\w*)\(\s*self", text, re.M)
        if m.group(1) in private
    }
    assert not elsewhere, f"private methods of {base.__name__} overridden outside {home}: {sorted(elsewhere)}"


def test_a_changed_signature_is_caught():
    """The check itself: a declared parameter list that differs from the library's is reported."""

    class Base:
        def _hook(self, a, b=1):
            pass

    assert parameters(Base._hook) == "(self, a, b=1)"
    assert parameters(Base._hook) != "(self, a)"
