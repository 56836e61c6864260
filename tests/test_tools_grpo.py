"""Tool-use GRPO (align/tools/grpo.py): rollouts through the turn loop, rewards on what the policy wrote, the loss and
importance ratios on policy tokens only, tool metrics logged. A scripted engine decides each turn (half the samples
call the calculator and answer with its result, half answer at once and wrongly), so rewards are known."""

from __future__ import annotations

import datasets
import pytest
import torch

from align.grpo.config import GRPOConfig
from align.grpo.prompts import prepare_prompts
from align.grpo.trainer import GRPOTrainer
from align.rollout.base import Rollout
from align.tools import call_text
from align.tools.grpo import add_tools_to_prompts, build_tool_loop
from data_gen.tool_tasks import make_tool_tasks
from rewards import math_reward, tool_call_reward


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    from pretrain.tokenizer import train_tokenizer

    torch.set_num_threads(2)
    rows = make_tool_tasks(["tool_arithmetic"], num=40, seed=0)
    texts = [
        r["prompt"] + " " + call_text("calculator", {"expression": "1 * 2"}) + " \\boxed{" + r["answer"] + "}"
        for r in rows
    ]
    tok = train_tokenizer(texts * 3, vocab_size=400)
    root = tmp_path_factory.mktemp("tools_grpo")
    return {
        "model": tiny_model(root / "model", tok, seed=0, max_position_embeddings=1024),
        "tokenizer": tok,
        "rows": rows,
    }


class CalcEngine:
    """Even samples call the calculator with the row's expression, then answer with the tool's reply; odd samples
    answer 7 at once. Tokens are the tokenizer's own; log-probs a fixed -0.5."""

    def __init__(self, tok):
        self.tok, self.end = tok, tok.convert_tokens_to_ids("<|im_end|>")
        self.pushed = 0

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            group = []
            for k in range(params.n):
                if "<|im_start|>tool\n" in text:
                    reply = text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
                    answer = f"The answer is \\boxed{{{reply}}}."
                elif k % 2 == 0:
                    q = text.rsplit("What is ", 1)[1].split("?")[0]
                    expr = q.replace(" times ", " * ").replace(" plus ", " + ")
                    answer = call_text("calculator", {"expression": expr})
                else:
                    answer = "The answer is \\boxed{7}."
                ids = self.tok(answer, add_special_tokens=False)["input_ids"] + [self.end]
                group.append(Rollout(list(p), ids, [-0.5] * len(ids), "stop"))
            out.append(group)
        return out

    def update_weights(self, named_params):
        self.pushed += 1

    def close(self):
        pass


def _trainer(tiny, tmp_path, **kw):
    from transformers import AutoModelForCausalLM

    kw = {"max_steps": 2, "learning_rate": 1e-3, **kw}
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=160,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=False,
        lr_scheduler_type="constant",
        tools=["calculator"],
        max_turns=3,
        reward_funcs=["math_reward", "tool_call_reward"],
        **kw,
    )
    rows = [
        {
            "prompt": [{"role": "system", "content": "/no_think"}, {"role": "user", "content": r["prompt"]}],
            "answer": r["answer"],
            "reward": "math_reward",
        }
        for r in tiny["rows"]
    ]
    loop = build_tool_loop(args, tiny["tokenizer"])
    train = add_tools_to_prompts(prepare_prompts(datasets.Dataset.from_list(rows)), loop)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[math_reward, tool_call_reward],
        args=args,
        train_dataset=train,
        processing_class=tiny["tokenizer"],
        engine=CalcEngine(tiny["tokenizer"]),
    )
    trainer.use_tools(loop)
    return trainer


def test_tool_grpo_rewards_the_policys_answer_and_trains_only_its_tokens(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path)
    seen = []
    score = trainer._generate_and_score_completions

    def capture(inputs):
        out = score(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tools/calls_per_rollout" in h]
    assert logs and all(h["tools/calls_per_rollout"] == 0.5 and h["tools/status/ok"] == 0.5 for h in logs)
    # callers are right (math 1, call +1), direct answers wrong (0, no call 0): mean rewards 0.5 and 0.5
    assert all(h["rewards/math_reward/mean"] == 0.5 and h["rewards/tool_call_reward/mean"] == 0.5 for h in logs)
    batch = seen[0]
    mask, cmask = batch["tool_mask"], batch["completion_mask"]
    tok = tiny["tokenizer"]
    for row in range(mask.shape[0]):
        ids = batch["completion_ids"][row][cmask[row].bool()].tolist()
        inserted = [i for i, m in zip(ids, mask[row][cmask[row].bool()].tolist()) if not m]
        if row % 2 == 0:  # a caller: exactly the tool turn and the next header are masked
            assert tok.decode(inserted).startswith("\n<|im_start|>tool\n") and tok.decode(inserted).endswith(
                "<|im_start|>assistant\n<think>\n\n</think>\n"
            )
        else:
            assert inserted == []
    # the loss counts policy tokens only: the same as with the tool tokens cut out of completion_mask, and not the
    # same as with them counted
    trainer.model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, dict(batch)).item()
        cut = dict(batch, completion_mask=cmask * mask, tool_mask=torch.ones_like(mask))
        counted = dict(batch, tool_mask=torch.ones_like(mask))
        cut_loss, counted_loss = (trainer.compute_loss(trainer.model, b).item() for b in (cut, counted))
        # equal to float noise (3e-4 relative seen; the tool tokens' own weight is ~100x the loss: -0.33 vs -0.003)
        assert loss == pytest.approx(cut_loss, rel=1e-3)
        assert abs(loss - counted_loss) > 10 * abs(loss)


def test_tool_grpo_hands_the_rewards_each_trajectorys_answer_turn(tiny, tmp_path):
    """`answer_text` (the trajectory's last turn) reaches the reward functions as a column, so mode_format_reward
    judges a multi-turn answer by its answer turn (a tool GRPO run dropped the think block there, unseen)."""
    seen = []

    def spy(completions, answer_text=None, **kwargs):
        seen.append((completions, answer_text))
        return [0.0] * len(completions)

    trainer = _trainer(tiny, tmp_path, max_steps=1)
    trainer.reward_funcs.append(spy)
    trainer.reward_func_names.append("spy")
    trainer.reward_weights = torch.ones(len(trainer.reward_funcs))
    trainer.reward_processing_classes.append(None)
    trainer.train()
    completions, answers = seen[0]
    assert answers is not None and len(answers) == len(completions)
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    called = [(t, a) for t, a in zip(texts, answers) if "<tool_call>" in t]
    direct = [(t, a) for t, a in zip(texts, answers) if "<tool_call>" not in t]
    assert called and direct
    assert all(t.endswith(a) and "<tool_call>" not in a and "\\boxed{" in a for t, a in called)
    assert all(t == a for t, a in direct)


def test_tool_grpo_with_a_kl_anchor_keeps_the_kl_term_off_the_tool_tokens(tiny, tmp_path):
    """beta > 0 (the anchor to the reference model that would keep other families' form): TRL builds the reference
    model, the KL term is logged and moves once the policy moves, and it is masked like the policy loss."""
    trainer = _trainer(tiny, tmp_path, beta=0.5)
    assert trainer.ref_model is not None
    seen = []
    score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: seen.append(score(inputs)) or seen[-1]
    trainer.train()
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 1e-6  # policy == reference at step 1
    batch = seen[-1]
    assert batch["ref_per_token_logps"] is not None
    mask, ref = batch["tool_mask"], batch["ref_per_token_logps"]
    assert (mask == 0).any() and (mask == 1).any()
    trainer.model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, dict(batch)).item()
        # move the reference only where the tools wrote: the loss must not see it; where the policy wrote: it must
        on_tools = trainer.compute_loss(trainer.model, dict(batch, ref_per_token_logps=ref + 1.0 * (mask == 0))).item()
        on_policy = trainer.compute_loss(
            trainer.model, dict(batch, ref_per_token_logps=ref + 1.0 * (mask == 1))
        ).item()
    assert on_tools == pytest.approx(loss, rel=1e-6, abs=1e-7)
    assert abs(on_policy - loss) > 1e-2


def test_tool_use_distillation_scores_the_students_tokens_only(tiny, tmp_path, monkeypatch):
    """On-policy distillation with the calculator: the student's rollouts run the turn loop (scripted: half call and
    answer with the reply), the teacher reads the whole trajectory, and no label falls on a tool token."""
    import align.distill.trainer as distill
    from align.config import ModelConfig, ScriptArguments
    from align.distill import DistillConfig
    from align.rollout.sampler import Sampler

    tok = tiny["tokenizer"]
    monkeypatch.setattr(distill, "build_sampler", lambda *a, seed=0, **k: Sampler(CalcEngine(tok), a[5], seed=seed))
    seen = []
    inner = distill.DistillTrainer.compute_loss

    def capture(self, model, inputs, *a, **k):
        seen.append({key: inputs[key].clone() for key in ("input_ids", "labels")})
        return inner(self, model, inputs, *a, **k)

    monkeypatch.setattr(distill.DistillTrainer, "compute_loss", capture)
    script = ScriptArguments(
        dataset_name="builtin:tool_tasks",
        eval_num_prompts=4,
        eval_after=False,
        dataset_args={"families": ["tool_arithmetic"], "num": 16, "mode": "no_think"},
    )
    args = DistillConfig(
        output_dir=str(tmp_path / "d"),
        teacher_model_name_or_path=tiny["model"],
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        max_completion_length=96,
        max_length=1000,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=False,
        rollout_backend="hf",
        lmbda=1.0,
        distill_eval=False,
        tools=["calculator"],
        max_turns=3,
    )
    metrics = distill.main(script, args, ModelConfig(model_name_or_path=tiny["model"], dtype="float32"))
    assert metrics["tool_tokens_masked"] > 0 and seen
    trained_tool_tokens = 0
    for batch in seen:
        for ids, labels in zip(batch["input_ids"], batch["labels"]):
            scored = tok.decode(ids[labels != -100].tolist())
            trained_tool_tokens += scored.count("<|im_start|>tool")
            assert "<tool_call>" in scored or "\\boxed{" in scored  # the student's own writing is scored
    assert trained_tool_tokens == 0
    with pytest.raises(ValueError, match="plain view"):
        distill.check_tool_distillation(
            DistillConfig(
                output_dir=str(tmp_path / "x"),
                teacher_model_name_or_path="t",
                tools=["calculator"],
                teacher_hint=" ({answer})",
            ),
            False,
        )
    for loss in ("supervised", "sequence_kd", "rejection_sampling"):  # fixed completions: no room for tool calls
        with pytest.raises(ValueError, match=f"loss {loss} trains on fixed completions"):
            distill.check_tool_distillation(
                DistillConfig(
                    output_dir=str(tmp_path / "x"), teacher_model_name_or_path="t", tools=["calculator"], loss=loss
                ),
                False,
            )


def test_trls_own_vllm_bookkeeping_is_kept_without_tools(tiny, tmp_path):
    """The mixin answers TRL's "last loaded step" only for tool rollouts; TRL's own vLLM path still sees its value."""
    trainer = _trainer(tiny, tmp_path)
    assert trainer._last_loaded_step == trainer.state.global_step  # tools: our tool_rollout syncs
    trainer.tool_loop = None
    trainer._last_loaded_step = -1
    assert trainer._last_loaded_step == -1
    trainer._last_loaded_step = 7
    assert trainer._last_loaded_step == 7


def test_a_multi_turn_answer_is_judged_in_format_by_its_answer_turn():
    """Think mode over two turns: each turn opens its own think block, so the joined text never has the one-block
    form; GRPO's per-mode format metric reads the answer turn (ToolUse.format_view), without tools the whole text."""
    from align.tools.grpo import ToolUse
    from rewards.format import mode_format_reward

    call = "<think>\nI should use the calculator for this product\n</think>\n<tool_call>{...}</tool_call>"
    answer = "<think>\nthe tool said 5535 so that is the product here\n</think>\nThe answer is \\boxed{5535}."
    joined = call + "\n" + answer
    assert mode_format_reward([joined], mode=["think"]) == [0.0]
    assert mode_format_reward([answer], mode=["think"]) == [1.0]

    class Trainer(ToolUse):
        tool_loop = object()

    trainer = Trainer()
    trainer._answer_turns = {joined: answer}
    assert trainer.format_view([{"role": "assistant", "content": joined}]) == answer
    assert trainer.format_view("not a tool rollout") == "not a tool rollout"
    trainer.tool_loop = None
    assert trainer.format_view(joined) == joined


class ScriptedWorker(CalcEngine):
    """CalcEngine behind the engine process's interface (align.rollout.worker.EngineWorker): versioned weight pushes,
    and jobs that wait, in the caller's thread, for the version they need."""

    versioned = True

    def __init__(self, tok):
        import threading

        super().__init__(tok)
        self.version, self.jobs, self.cond = -1, [], threading.Condition()
        self.threads: set[str] = set()

    def update_weights(self, named_params, version=None):
        for _ in named_params:
            pass
        with self.cond:
            self.version = self.version + 1 if version is None else version
            self.pushed += 1
            self.cond.notify_all()

    def submit(self, prompts, params, min_version=None):
        import threading

        self.threads.add(threading.current_thread().name)
        self.jobs.append((prompts, params, self.version if min_version is None else min_version))
        return len(self.jobs) - 1

    def result(self, job, timeout_s=None):
        prompts, params, wanted = self.jobs[job]
        with self.cond:
            if not self.cond.wait_for(lambda: self.version >= wanted, timeout=timeout_s):
                raise TimeoutError("no new enough weights yet")
            version = self.version
        return self.generate(prompts, params), {"version": version, "generate_s": 0.0, "wait_s": 0.0}

    def cancel_pending(self):
        pass


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_async_tool_grpo_runs_the_turn_loop_ahead_and_keeps_the_tool_mask(tiny, tmp_path, max_staleness):
    """async_generation with tools: each batch's turn loop runs in the tool thread, every turn a job on the engine
    within max_staleness; the trajectories, rewards and masks are those of synchronous tool GRPO (the scripted
    engine answers the same whatever the weights), and with max_staleness 0 so are the losses."""
    runs = {}
    for name, kw in (("sync", {}), ("async", {"async_generation": True, "max_staleness": max_staleness})):
        trainer = _trainer(tiny, tmp_path / name, max_steps=3, **kw)
        if name == "async":
            trainer.sampler.engine = worker = ScriptedWorker(tiny["tokenizer"])
        seen = []
        score = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = lambda inputs, score=score, seen=seen: (
            seen.append(score(inputs)) or seen[-1]
        )
        trainer.train()
        runs[name] = (trainer, seen)
    (sync, sync_seen), (lagged, lagged_seen) = runs["sync"], runs["async"]
    assert [e["step"] for e in lagged.async_log] == [0, 1, 2]
    assert all(0 <= e["staleness"] <= max_staleness for e in lagged.async_log)
    assert any(t.startswith("smolalign-tool-loop") for t in worker.threads)  # the turn loop ran in the tool thread
    assert len(worker.jobs) == 3 * 2  # per batch: the first turns, then the callers' second turns
    for a, b in zip(sync_seen, lagged_seen):
        assert torch.equal(a["completion_ids"], b["completion_ids"]) and torch.equal(a["tool_mask"], b["tool_mask"])
        masked = ((1 - b["tool_mask"]) * b["completion_mask"]).sum()
        assert 0 < masked < b["completion_mask"].sum()  # tool tokens masked, the policy's kept
    keys = ["tools/calls_per_rollout", "rewards/math_reward/mean", "rewards/tool_call_reward/mean"]
    for key in keys:
        assert (
            [h[key] for h in lagged.state.log_history if key in h]
            == [h[key] for h in sync.state.log_history if key in h]
            == [0.5] * 3
        )
    if max_staleness == 0:
        assert [h["loss"] for h in lagged.state.log_history if "loss" in h] == pytest.approx(
            [h["loss"] for h in sync.state.log_history if "loss" in h], abs=1e-6
        )


REPLAY = {
    "replay_data": "builtin:tool_tasks",
    "replay_args": {"families": ["tool_arithmetic"], "num": 12, "mode": "no_think", "seed": 3},
}


def test_replay_rows_pull_the_policy_back_to_the_sft_traces(tiny, tmp_path):
    """replay_data (align/grpo/replay.py): GRPO + replay_coef x the NLL of tool-use traces' assistant turns. After the
    same steps on the same rollouts, the policy trained with replay rows writes the traces more likely than the one
    trained without; the NLL covers the calls and answers, never the tool replies; a micro-batch's rows depend on
    its step only (a resumed run reads what an uninterrupted one would)."""
    from align.grpo.replay import load_replay, replay_nll

    args = GRPOConfig(output_dir=str(tmp_path / "x"), seed=0, report_to="none", **REPLAY)
    rows = load_replay(args, tiny["tokenizer"])
    tok = tiny["tokenizer"]
    for r in rows:  # the loss covers what the assistant wrote: its call and its answer, not the calculator's reply
        trained = tok.decode([i for i, m in zip(r["input_ids"], r["assistant_masks"]) if m])
        assert "<tool_call>" in trained and "\\boxed{" in trained and "<|im_start|>tool" not in trained

    def nll(trainer):
        trainer.model.eval()
        with torch.no_grad():
            return replay_nll(trainer.model, rows, tok.pad_token_id or 0).item()

    # plain SGD: a step is its gradient (Adam's first steps are lr x its sign, whatever the loss: no contrast)
    sgd = {"max_steps": 4, "learning_rate": 0.5, "optim": "sgd"}
    plain = _trainer(tiny, tmp_path / "plain", **sgd)
    start = nll(plain)
    plain.train()
    replayed = _trainer(tiny, tmp_path / "replay", replay_coef=1.0, **sgd, **REPLAY)
    replayed.train()
    logged = [h["replay/nll"] for h in replayed.state.log_history if "replay/nll" in h]
    assert len(logged) == 4 and logged[-1] < logged[0]
    # measured: start 5.79, plain 5.78 (the scripted rollouts' GRPO gradient is ~300x smaller), replayed 4.46
    assert nll(replayed) < min(start, nll(plain)) - 0.5, (start, nll(plain), nll(replayed))

    fresh = _trainer(tiny, tmp_path / "fresh", max_steps=4, **REPLAY)
    picks = []
    for trainer in (replayed, fresh):  # one trained 4 steps, one never: step 7's two micro-batches
        trainer.state.global_step = 7
        picks.append([[r["input_ids"] for r in trainer._next_replay_rows()] for _ in range(2)])
    assert picks[0] == picks[1] and picks[0][0] != picks[0][1]


def test_replay_settings_that_cannot_run_are_one_line(tiny, tmp_path):
    import json

    with pytest.raises(ValueError, match="replay_coef must be > 0"):
        GRPOConfig(output_dir=str(tmp_path), report_to="none", replay_coef=0.0, **REPLAY)
    prompts = tmp_path / "prompts.jsonl"  # prompts and answers, no conversations: refused when the trainer is built
    prompts.write_text(
        "\n".join(json.dumps({"prompt": f"What is {i} plus 1?", "answer": str(i + 1)}) for i in range(3))
    )
    with pytest.raises(ValueError, match="has no `messages` column"):
        _trainer(tiny, tmp_path, replay_data=str(prompts))
    with pytest.raises(ValueError, match="no conversation has an assistant token within replay_max_length"):
        _trainer(tiny, tmp_path, replay_max_length=64, **REPLAY)  # the tool schemas alone are longer


def test_replay_nll_is_the_same_under_padding_free_attention(tiny, tmp_path):
    """`padding_free: true` runs the whole training step, the replay pass included, under the per-document attention
    (align/grpo/packing.py). The replay batch is right-padded with positions 0..L-1 per row: one document a row, the
    pad tail after it, which a causal query never reads. So the NLL must not move."""
    from transformers import AutoModelForCausalLM

    from align.grpo.packing import packed_attention
    from align.grpo.replay import load_replay, replay_nll

    mixed = {**REPLAY, "replay_args": {**REPLAY["replay_args"], "mode": "mixed"}}  # think rows are longer
    args = GRPOConfig(output_dir=str(tmp_path), seed=0, report_to="none", **mixed)
    rows = load_replay(args, tiny["tokenizer"])[:3]
    cut = [min(len(r["input_ids"]), 1024 - 24 * i) for i, r in enumerate(rows)]  # unequal rows: padding in the batch
    rows = [{k: v[:n] for k, v in r.items()} for r, n in zip(rows, cut)]
    assert len(set(cut)) == 3 and all(sum(r["assistant_masks"]) for r in rows)
    model = AutoModelForCausalLM.from_pretrained(tiny["model"]).eval()
    with torch.no_grad():
        plain = replay_nll(model, rows, 0)
        with packed_attention(model):
            assert model.config._attn_implementation == "sdpa_documents"  # the per-document path is what ran
            packed = replay_nll(model, rows, 0)
    assert torch.allclose(plain, packed, atol=1e-5), (plain, packed)
