"""The weight sync: how a trainer's weights reach an engine that holds a copy of its own.

A trainer that generates with vLLM (in-process, in its own process, or a `trl vllm-serve` server) trains one copy
of the weights and samples from another. After an optimizer step the engine must generate exactly what the
trained model would (the greedy-parity tests check it, tied embeddings included). `WeightSync` owns that:

- **when** (`sync`): after the weights changed (the trainer's step moved since the last push), or when the engine
  dropped its weights while it slept (vLLM sleep level 2); never when the engine shares the trained model object
  (the hf backend generates with it: nothing to push);
- **what** (`push`): every parameter whole and one at a time, with LoRA merged
  (`align.runtime.distributed.iter_full_params`: gathered under ZeRO-3, `full_tensor()` under FSDP2);
- **from where**: every rank runs the gathers (they are collective); a server is sent the weights by the main
  process only, and no rank samples from it until it has them; an engine in its own process also gets the
  weights' version (the trainer's step), which asynchronous generation's staleness bound reads.

Each engine's own `update_weights` (align/rollout/hf.py, vllm.py, vllm_server.py, worker.py) loads what it is sent.

    sync = WeightSync(engine, accelerator)
    sync.sync(trainer.model_wrapped, step, shares=False)   # every rank, before generating
"""

from __future__ import annotations

import contextlib
from typing import Any

from align.runtime.distributed import iter_full_params


class WeightSync:
    """Keeps `engine`'s weights equal to the trained model's (see the module doc)."""

    def __init__(self, engine: Any, accelerator: Any):
        self.engine, self.accelerator = engine, accelerator
        self.num_pushes = 0
        self.synced_step: int | None = None  # None: push before the first generation (a cached engine may be stale)

    @property
    def backend(self) -> str:
        return getattr(self.engine, "backend", "custom")

    def push(self, model, version: int | None = None) -> None:
        """Send the (unwrapped) model's current weights to the engine: gathered one parameter at a time, LoRA
        merged. A vLLM server gets them from the main process only; the other ranks still take part in the gathers.
        An engine in its own process (align.rollout.worker) also gets the weights' `version` (the trainer's step)."""
        params = iter_full_params(model, self.accelerator)
        main = self.accelerator is None or self.accelerator.is_main_process
        pause = getattr(self.engine, "paused", None)  # a shared server's asynchronous jobs (align.rollout.worker)
        with pause() if pause is not None else contextlib.nullcontext():
            if pause is not None and self.accelerator is not None:
                self.accelerator.wait_for_everyone()  # no rank's generation is on the server while it changes
            if pause is not None:
                self.engine.update_weights(params, version=version, send=main)
            elif self.backend == "vllm-server" and not main:
                for _ in params:  # the gathers are collective
                    pass
            elif getattr(self.engine, "versioned", False):
                self.engine.update_weights(params, version=version)
            else:
                self.engine.update_weights(params)
            self.num_pushes += 1
            if self.backend == "vllm-server" and self.accelerator is not None:
                self.accelerator.wait_for_everyone()  # nobody samples from the server before it has the new weights

    def sync(self, model, step: int, shares: bool) -> None:
        """Push when the engine holds its own copy (`shares` False) and the weights changed since the last push
        (step moved), or the engine dropped its weights while it slept (level 2: nothing to generate with until the
        next push)."""
        if self.synced_step == step and not getattr(self.engine, "weights_discarded", False):
            return
        if not shares:
            self.push(model, version=step)
        self.synced_step = step
