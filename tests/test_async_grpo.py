"""align/grpo/async_generation.py + align/rollout/worker.py: asynchronous GRPO on a tiny random model — the engine in
its own process samples what the trainer's own engine samples, `max_staleness: 0` trains as synchronous GRPO, the
staleness bound holds when the engine runs ahead, importance ratios are 1 when engine and trainer agree, and the
settings it cannot run with are one-line errors."""

from __future__ import annotations

import threading
import time

import datasets
import pytest
import torch

from align.grpo.config import GRPOConfig
from align.grpo.prompts import prepare_prompts
from align.grpo.trainer import GRPOTrainer
from align.rollout import SamplingParams, get_engine
from align.rollout.hf import load_model
from align.rollout.sampler import Sampler, build_sampler
from align.rollout.worker import EngineWorker, ServerWorker
from data_gen.tasks import make_tasks, prompt_messages, to_messages

FAMILIES = ["arithmetic", "compare", "count_items"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    from pretrain.tokenizer import train_tokenizer

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("async_grpo")
    rows = make_tasks(FAMILIES, num=120, split="train", seed=0)
    tok = train_tokenizer([m["content"] for r in rows for m in to_messages(r, "think")] * 3, vocab_size=400)
    return {"model": tiny_model(root / "model", tok, seed=0), "tokenizer": tok}


def _rows(n: int = 48) -> datasets.Dataset:
    rows = make_tasks(FAMILIES, num=n, split="train", seed=1)
    for r in rows:
        r["prompt_messages"] = prompt_messages(r, "no_think")
    return datasets.Dataset.from_list(rows)


class Recorder:
    """A reward that varies with the completion (its length) and records every completion it scores, per call."""

    __name__ = "length_reward"

    def __init__(self):
        self.seen: list[list[str]] = []

    def __call__(self, completions, **kwargs):
        self.seen.append([c[0]["content"] for c in completions])
        return [len(c[0]["content"]) / 10 for c in completions]


class HalfFlat(Recorder):
    """Prompts of even length score 0 whatever the completion (a group with no signal), the others by length."""

    __name__ = "half_flat_reward"

    def __call__(self, completions, prompts, **kwargs):
        self.seen.append([c[0]["content"] for c in completions])
        return [
            0.0 if len(p[-1]["content"]) % 2 == 0 else len(c[0]["content"]) / 10 for p, c in zip(prompts, completions)
        ]


class LocalServer:
    """A stand-in for a vllm-server engine (no server runs on a CPU): an hf engine of its own, which refuses a weight
    push while it generates (a batch of two policies) and writes the weights version it sampled with into each
    rollout's finish_reason."""

    backend, logprobs_kind = "vllm-server", "sampling"

    def __init__(self, model_path, generate_s: float = 0.0):
        self.inner = None if model_path is None else get_engine(model_path, backend="hf")
        self.version, self.generating, self.generate_s, self.pushes = 0, 0, generate_s, 0

    def generate(self, prompts, params):
        self.generating += 1
        try:
            version = self.version
            time.sleep(self.generate_s)
            groups = (
                self.inner.generate(prompts, params)
                if self.inner is not None
                else [[get_rollout(p, version) for _ in range(params.n)] for p in prompts]
            )
            assert self.version == version, "the weights changed under a generation"
            for group in groups:
                for r in group:
                    r.finish_reason = f"v{version}"
            return groups
        finally:
            self.generating -= 1

    def update_weights(self, named_params):
        assert not self.generating, "a push while a generation is on the server"
        named = list(named_params)
        if self.inner is not None:
            self.inner.update_weights(named)
        time.sleep(0.01)
        self.version += 1
        self.pushes += 1

    def close(self):
        pass


def get_rollout(prompt, version):
    from align.rollout.base import Rollout

    return Rollout(list(prompt), [version + 3], None, "length")


class Ranks:
    """N ranks as threads of this process: what the Sampler reads of an accelerator."""

    def __init__(self, n: int):
        self.barrier = threading.Barrier(n)
        self.state = type("State", (), {"deepspeed_plugin": None})()

    def rank(self, index: int):
        ranks = self

        class Accelerator:
            process_index, is_main_process, state = index, index == 0, ranks.state

            def wait_for_everyone(self):
                ranks.barrier.wait(timeout=30)

            def unwrap_model(self, model):
                return model

        return Accelerator()


def test_server_jobs_never_see_a_push_and_name_the_version_the_server_held():
    """Two ranks share one server: each rank's jobs run in a thread, a push pauses every rank's generation (the stub
    fails if weights change under one), and each batch names the version the server sampled it with, within the
    staleness bound."""
    server = LocalServer(None, generate_s=0.02)  # rollouts from the stub alone: what matters is who holds it when
    server.version = -1
    ranks, found, errors = Ranks(2), {0: [], 1: []}, []
    model = torch.nn.Linear(2, 2)

    def rank(i):
        try:
            sampler = Sampler(ServerWorker(server), ranks.rank(i))
            jobs = []
            for step in range(6):
                sampler.push(model, version=step)
                jobs += [
                    (step, sampler.engine.submit([[1, 2]] * 2, SamplingParams(n=2), min_version=max(0, step - 1)))
                    for _ in range(2)
                ]
                while jobs and jobs[0][0] <= step - 1:  # the batches of the step before: trained now
                    s, job = jobs.pop(0)
                    groups, info = sampler.engine.result(job, timeout_s=30)
                    found[i].append((s, info["version"], {r.finish_reason for g in groups for r in g}))
            sampler.engine.cancel_pending()
            sampler.engine.close()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)
            ranks.barrier.abort()

    threads = [threading.Thread(target=rank, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert server.pushes == 6  # the main rank sends; the other only publishes
    for i in (0, 1):
        assert len(found[i]) == 10
        for step, version, reasons in found[i]:
            assert reasons == {f"v{version}"}  # the version named is the one the server held
            assert step - 1 <= version <= step + 1  # never older than the bound allows


def test_async_grpo_on_a_server_with_max_staleness_0_trains_as_synchronous_grpo(tiny, tmp_path):
    """rollout_backend vllm-server with async_generation: the server's jobs in a thread (a local stand-in for the
    server), pushes between generations; with max_staleness 0 the same samples and losses as synchronous GRPO."""
    sync, sync_seen = _run(tiny, tmp_path / "sync", asynchronous=False)
    served, served_seen = _run(tiny, tmp_path / "served", asynchronous=True, max_staleness=0, server=True)
    assert sync_seen.seen == served_seen.seen
    assert [e["staleness"] for e in served.async_log] == [0, 0, 0, 0]
    assert _logged(served, "loss") == pytest.approx(_logged(sync, "loss"), abs=1e-5)
    ahead, _ = _run(tiny, tmp_path / "ahead", asynchronous=True, max_staleness=1, server=True, slow_step_s=0.3)
    assert all(0 <= e["staleness"] <= 1 for e in ahead.async_log) and len(ahead.async_log) == 4


def _run(
    tiny,
    tmp_path,
    *,
    asynchronous: bool,
    max_staleness: int = 1,
    steps: int = 4,
    slow_step_s: float = 0.0,
    reward: Recorder | None = None,
    server: bool = False,
    **kw,
):
    kw = {"bf16": False, **kw}
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        learning_rate=5e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        lr_scheduler_type="constant",
        temperature=1.0,
        async_generation=asynchronous,
        max_staleness=max_staleness,
        **kw,
    )
    torch.manual_seed(0)
    model = load_model(tiny["model"], dtype="float32")
    reward = reward or Recorder()
    engine = None if asynchronous else get_engine(model, backend="hf")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=prepare_prompts(_rows(), None),
        processing_class=tiny["tokenizer"],
        engine=engine,
    )
    if server:
        trainer.sampler = Sampler(ServerWorker(LocalServer(tiny["model"])), trainer.accelerator, seed=0)
    elif asynchronous:
        trainer.sampler = build_sampler(
            "hf",
            {},
            model,
            tiny["model"],
            tiny["tokenizer"],
            trainer.accelerator,
            seed=0,
            logprobs_kind="sampling",
            own_process=True,
            threads=torch.get_num_threads(),
        )
    if slow_step_s:
        step = trainer.training_step

        def slow(*a, **k):
            time.sleep(slow_step_s)
            return step(*a, **k)

        trainer.training_step = slow
    try:
        trainer.train()
    finally:
        if trainer.sampler is not None:
            trainer.sampler.close(trainer.model_wrapped)
    return trainer, reward


def _logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def test_an_engine_in_its_own_process_samples_what_the_in_process_engine_samples_and_waits_for_its_version(tiny):
    model = load_model(tiny["model"], dtype="float32")
    local = get_engine(model, backend="hf")
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_new_tokens=10, logprobs_kind="sampling")
    prompts = [[1, 5, 6], [1, 9]]
    worker = EngineWorker(tiny["model"], backend="hf", knobs={"dtype": "float32"}, threads=torch.get_num_threads())
    try:
        worker.update_weights(model.named_parameters(), version=0)
        groups, info = worker.result(worker.submit(prompts, params, min_version=0))
        ref = local.generate(prompts, params)
        assert info["version"] == 0
        assert [[r.completion_ids for r in g] for g in groups] == [[r.completion_ids for r in g] for g in ref]
        assert [[r.logprobs for r in g] for g in groups] == [[r.logprobs for r in g] for g in ref]
        # a job that needs version 2 waits for it, then samples with those weights (not the ones it had)
        job = worker.submit(prompts, params, min_version=2)
        time.sleep(0.3)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)
        worker.update_weights(model.named_parameters(), version=2)
        groups, info = worker.result(job)
        assert info["version"] == 2 and info["wait_s"] >= 0.25
        assert [r.logprobs for r in groups[0]] == [r.logprobs for r in local.generate(prompts, params)[0]]
        # an error in the child comes back as an error, and the worker still serves the next job
        with pytest.raises(RuntimeError, match="outside"):
            worker.generate([[10_000]], params)
        assert len(worker.generate(prompts, params)) == 2
    finally:
        worker.close()
    with pytest.raises(ValueError, match="hf or vllm"):
        EngineWorker(tiny["model"], backend="vllm-server")


def test_max_staleness_0_samples_and_trains_as_synchronous_grpo(tiny, tmp_path):
    sync, sync_seen = _run(tiny, tmp_path / "sync", asynchronous=False)
    lagless, lagless_seen = _run(tiny, tmp_path / "async0", asynchronous=True, max_staleness=0)
    assert sync_seen.seen == lagless_seen.seen  # the same completions at every step: same weights, same seeds
    assert [e["staleness"] for e in lagless.async_log] == [0, 0, 0, 0]
    assert _logged(lagless, "loss") == pytest.approx(_logged(sync, "loss"), abs=1e-5)
    # the engine's policy is the trainer's (fp32): the importance ratios are 1
    for key in ("min", "max"):
        assert all(abs(r - 1) < 1e-5 for r in _logged(lagless, f"sampling/importance_sampling_ratio/{key}"))
    after = dict(lagless.model.named_parameters())
    # the same weights within a fiftieth of one step's size (Adam normalises the ratio's 1e-7 noise on near-zero
    # gradients to steps of ~lr: seen 1e-4 after 4 steps at lr 5e-2)
    assert max((p - after[n]).abs().max().item() for n, p in sync.model.named_parameters()) < 1e-3


def test_under_bf16_the_engines_fp32_samples_are_corrected_with_ratios_near_1(tiny, tmp_path, keep_bf16):
    """The trainer's forward runs under bf16 autocast, the engine process samples with the fp32 weights: the ratios
    are not exactly 1 but within 0.05 of it (mean), and the correction is applied."""
    trainer, _ = _run(tiny, tmp_path, asynchronous=True, max_staleness=0, steps=2, bf16=True)
    means = _logged(trainer, "sampling/importance_sampling_ratio/mean")
    assert len(means) == 2 and all(abs(r - 1) < 0.05 for r in means)
    assert max(_logged(trainer, "sampling/sampling_logp_difference/max")) > 0  # bf16 is not fp32


def test_the_engine_runs_ahead_of_a_slow_trainer_within_max_staleness(tiny, tmp_path):
    trainer, recorder = _run(tiny, tmp_path, asynchronous=True, max_staleness=2, steps=6, slow_step_s=0.5)
    log = trainer.async_log
    assert [e["step"] for e in log] == list(range(6))
    assert all(0 <= e["staleness"] <= 2 for e in log)  # the bound: never older
    versions = [e["version"] for e in log]
    assert versions == sorted(versions) and versions[0] == 0
    # batches were sampled ahead of the step that trains them (a synchronous engine never is). How far ahead
    # depends on the machine's load: an engine that starts a batch late samples it with the newer weights pushed
    # by then (seen: [0, 0, 1, 1, 3, 3] on a loaded machine, [0, 0, 0, 1, 2, 3] on an idle one).
    assert sum(e["staleness"] > 0 for e in log) >= 3
    # overlap: after the first step the trainer waited less, in all, than the engine spent generating (without
    # overlap every wait holds a whole generation)
    assert sum(e["trainer_wait_s"] for e in log[1:]) < sum(e["generate_s"] for e in log[1:])
    assert len(recorder.seen) == 6 and _logged(trainer, "async/staleness")
    # the lag is corrected: the ratios move away from 1 once batches are stale, and stay capped
    high = _logged(trainer, "sampling/importance_sampling_ratio/max")
    assert max(high) > 1 + 1e-4 and max(high) <= trainer.args.vllm_importance_sampling_clip_max + 1e-6


def test_dynamic_sampling_refills_through_the_engine_process_within_max_staleness(tiny, tmp_path):
    """Groups with no reward variance are dropped and refilled from fresh prompts: round 1 is the batch generated
    ahead, each refill round is generated by the engine process at the step it is needed, within the bound."""
    reward = HalfFlat()
    trainer, _ = _run(
        tiny,
        tmp_path,
        asynchronous=True,
        max_staleness=1,
        steps=4,
        reward=reward,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=3,
        slow_step_s=0.2,
    )
    rounds = _logged(trainer, "dynamic_sampling/rounds")
    assert len(rounds) == 4 and max(rounds) > 1  # refills happened
    assert len(reward.seen) == sum(rounds)  # every round was scored: the first from ahead, the refills now
    assert len(_logged(trainer, "async/refill_s")) == sum(r > 1 for r in rounds)
    assert [e["step"] for e in trainer.async_log] == [0, 1, 2, 3]
    assert all(0 <= e["staleness"] <= 1 for e in trainer.async_log)
    # the refills paid off: more groups with signal than the first rounds alone had (half the prompts are flat)
    kept = _logged(trainer, "dynamic_sampling/kept_ratio")
    assert sum(kept) / len(kept) > 0.75, kept
    # a refill is fresh sampling: its completions are not a replay of the step's first round
    assert all(reward.seen[i] != reward.seen[i + 1] for i in range(len(reward.seen) - 1))


def _pushes(sync_every: int, max_staleness: int, steps: int = 12, refill_at: tuple[int, ...] = ()) -> list[int]:
    """The steps at which `AsyncGeneration._publish` pushes in a run of `steps` with a full lookahead: at step t the
    jobs of steps t..t+k are queued (each needs the weights of its step - k), the trainer takes job t, and a refill
    round at the steps `refill_at` waits behind the rest. Asserts the engine could serve every job it must."""
    import types
    from collections import deque

    from align.grpo.async_generation import AsyncGeneration

    pushed = []
    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(sync_every=sync_every, max_staleness=max_staleness),
        state=types.SimpleNamespace(global_step=0),
        _async_published=-1,
        _async_jobs=deque(),
    )
    trainer.sync_engine = lambda: pushed.append(trainer.state.global_step)
    for step in range(steps):
        trainer.state.global_step = step
        trainer._async_jobs = deque((None, None, 1, s) for s in range(step, min(step + max_staleness + 1, steps)))
        AsyncGeneration._publish(trainer)
        trainer._async_jobs.popleft()
        assert step - max_staleness <= trainer._async_published  # this step's batch can be sampled
        if step in refill_at:  # a refill job queued behind the rest: every job ahead of it must be servable
            AsyncGeneration._publish(trainer, behind_queue=True)
            assert all(s - max_staleness <= trainer._async_published for *_, s in trainer._async_jobs)
    return pushed


@pytest.mark.parametrize(
    "sync_every, max_staleness, expected",
    [
        (1, 1, list(range(12))),
        (2, 1, [0, 2, 4, 6, 8, 10]),
        (4, 1, [0, 2, 4, 6, 8, 10]),  # above k + 1: the bound pushes every k + 1 steps
        (2, 3, [0, 2, 4, 6, 8, 10]),
        (4, 3, [0, 4, 8]),
        (4, 0, list(range(12))),  # no lag allowed: every step's batch needs that step's weights
    ],
)
def test_sync_every_skips_pushes_within_the_staleness_bound(sync_every, max_staleness, expected):
    assert _pushes(sync_every, max_staleness) == expected


def test_a_refill_behind_the_queue_gets_the_weights_the_jobs_ahead_of_it_wait_for():
    # sync_every 4, k 3: no push is due at step 1, but the job of step 4 (queued ahead of the refill) needs step 1's
    assert _pushes(4, 3, refill_at=(1,)) == [0, 1, 5, 9]


def test_sync_every_2_pushes_every_other_step_and_the_engine_keeps_the_bound(tiny, tmp_path):
    """The engine in its own process, 4 steps with max_staleness 1 and sync_every 2: two pushes (steps 0 and 2); the
    batches queued for newer weights wait in the engine for them, and every trained batch is at most 1 step old."""
    trainer, recorder = _run(tiny, tmp_path, asynchronous=True, max_staleness=1, sync_every=2)
    assert trainer.sampler.num_pushes == 2
    assert [e["step"] for e in trainer.async_log] == [0, 1, 2, 3]
    assert all(0 <= e["staleness"] <= 1 for e in trainer.async_log) and len(recorder.seen) == 4
    assert {e["version"] for e in trainer.async_log} <= {0, 2}  # only pushed weights sample


@pytest.mark.parametrize(
    "knob, message",
    [
        ({"rollout_backend": "trl"}, "its own process or on a server"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"sync_every": 0}, "sync_every"),
        ({"vllm_importance_sampling_correction": False}, "vllm_importance_sampling_correction"),
        ({"num_iterations": 2}, "num_iterations"),
    ],
)
def test_settings_async_generation_cannot_run_with_are_one_line_errors(tmp_path, knob, message):
    with pytest.raises(ValueError, match=message) as err:
        GRPOConfig(
            output_dir=str(tmp_path),
            async_generation=True,
            report_to="none",
            per_device_train_batch_size=8,
            num_generations=4,
            **knob,
        )
    assert "\n" not in str(err.value)


def test_build_sampler_puts_a_vllm_server_behind_asynchronous_jobs(tiny):
    """`build_sampler(..., own_process=True)` for vllm-server: TRL's client against a stub HTTP server (no server runs
    on a CPU), its jobs in a thread, the version they waited for named; a push needs a GPU (NCCL) and says so."""
    from stub_vllm_server import stub_vllm_server

    model = load_model(tiny["model"], dtype="float32")
    with stub_vllm_server(lambda prompt, k, max_tokens: [len(prompt), k]) as url:
        sampler = build_sampler(
            "vllm-server",
            {"base_url": url, "timeout": 5},
            model,
            tiny["model"],
            tiny["tokenizer"],
            None,
            own_process=True,
            logprobs_kind="sampling",
        )
        worker = sampler.engine
        assert isinstance(worker, ServerWorker) and worker.logprobs_kind == "sampling"
        worker.update_weights(iter(()), version=0, send=False)  # a rank that does not send only publishes
        job = worker.submit([[5, 6, 7], [8]], SamplingParams(n=2, max_new_tokens=4, logprobs=False), min_version=0)
        groups, info = worker.result(job, timeout_s=30)
        assert info["version"] == 0 and [[r.completion_ids for r in g] for g in groups] == [
            [[3, 0], [3, 1]],
            [[1, 0], [1, 1]],
        ]
        with pytest.raises(RuntimeError, match="NCCL"):
            worker.update_weights(model.named_parameters(), version=1)
        sampler.close()
