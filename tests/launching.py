"""How the distributed and kill tiers (and the `micro` fixture) launch stages as users do: the environment every
launched process gets (one torch thread per rank, offline, wandb offline, a small vLLM KV cache, unbuffered
output, the repo on PYTHONPATH, no debug tracebacks) and a free port for each launch."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ENV = {
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "PYTHONUNBUFFERED": "1",
}


def launch_env(**extra: str) -> dict:
    env = {**os.environ, **ENV, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("SMOLALIGN_DEBUG", None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
