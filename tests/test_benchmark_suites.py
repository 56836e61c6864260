"""scripts/benchmarks: the measuring logic of the suites, without the models (the suites themselves run in
`make bench` / `python scripts/benchmark.py <suite>`, never in the test suite: timings are not asserted).

Run: pytest tests/test_benchmark_suites.py -q   (seconds)
"""

from __future__ import annotations

from types import SimpleNamespace

from bench_suites import suite as _suite


def test_time_to_accuracy_clock_counts_training_not_evaluation_and_stops_at_the_target(monkeypatch):
    tta = _suite("grpo_tta")
    now = [0.0]  # a fake clock: steps take 1 s, evaluations 5 s
    monkeypatch.setattr(tta.time, "perf_counter", lambda: now[0])
    accuracies = iter([0.20, 0.25, 0.31, 0.40])

    def evaluate():
        now[0] += 5.0
        return next(accuracies)

    clock = tta._Clock(evaluate, every=2)
    clock.target = 0.30
    cb, args = clock.callback, SimpleNamespace()
    control = SimpleNamespace(should_training_stop=False)
    cb.on_train_begin(args, SimpleNamespace(global_step=0), control)
    for step in range(1, 9):
        now[0] += 1.0
        cb.on_step_end(args, SimpleNamespace(global_step=step), control)
        if control.should_training_stop:
            break
    now[0] += 0.5  # the trainer's own wrap-up after the last step
    cb.on_train_end(args, SimpleNamespace(global_step=step), control)
    assert step == 6 and clock.points == [(2, 2.0, 0.20), (4, 4.0, 0.25), (6, 6.0, 0.31)]  # stopped at the target
    assert clock.train_s == 6.5  # six steps and the wrap-up; none of the three evaluations


def test_summary_line_shape():
    common = _suite("common")
    assert common.summary_line("grpo_tta", "ours/trl-default", "seconds-to-target", 1.54, 1.5) == (
        "grpo_tta: ours/trl-default seconds-to-target ratio 1.54 (target >= 1.5)"
    )


def test_rollout_ceiling_products_are_exact_and_its_clock_is_prefill_plus_decode_steps(monkeypatch):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    rollout = _suite("rollout")
    weight, x = torch.randn(48, 32), torch.randn(8, 32)
    kernels = rollout._linear_kernels(weight, 8)
    assert "F.linear" in kernels and ("onednn" in kernels) == torch.backends.mkldnn.is_available()
    for rows in (8, 3):  # the rows it was packed for, and fewer (rows that finished leave the batch)
        reference = torch.nn.functional.linear(x[:rows], weight)
        for name, fn in kernels.items():
            out = fn(x[:rows])
            assert torch.equal(out, reference) if name != "onednn" else torch.allclose(out, reference, atol=1e-5)

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    calls = []

    slow = {"F.linear": 2.0}  # the kernel that does not win takes twice as long

    def fake_median_time(fn, reps=3, warmup=1):
        kernel = list(kernels)[len(calls) // 2]  # each kernel is timed as a step, then a prefill
        calls.append(fn.__name__)
        return {"step": 0.01, "prefill_pass": 0.5}[fn.__name__] * slow.get(kernel, 1.0)

    monkeypatch.setattr(rollout, "median_time", fake_median_time)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    # 3 rows x 11 tokens: one prefill, then 10 decode steps (the first token comes from the prefill's logits); the
    # fastest kernel's clock
    tokens_per_s, best = rollout._decode_ceiling(model, prompts, new=11)
    assert abs(tokens_per_s - 33 / (0.5 + 10 * 0.01)) < 1e-9 and (best != "F.linear" or len(kernels) == 1)
    assert calls == ["step", "prefill_pass"] * len(kernels)


def test_async_suite_step_clock_times_steps_after_the_first(monkeypatch):
    suite = _suite("grpo_async")
    now = [0.0]
    monkeypatch.setattr(suite.time, "perf_counter", lambda: now[0])
    clock = suite._StepClock()
    cb, args, control = clock.callback, SimpleNamespace(), SimpleNamespace()
    cb.on_train_begin(args, SimpleNamespace(global_step=0), control)
    for step, seconds in enumerate([9.0, 2.0, 3.0], start=1):  # the first step pays the warm-up
        now[0] += seconds
        cb.on_step_end(args, SimpleNamespace(global_step=step), control)
    assert clock.per_step() == [2.0, 3.0]
