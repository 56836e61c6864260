"""align/grpo/trainer.py: GRPO on a tiny random model — rewards get the right columns, the policy moves, dynamic
sampling drops zero-variance groups, truncated completions are masked, outside verifiers plug in, bad names are
clear."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import datasets
import pytest
import torch

import align.rollout as rollout
from align.grpo.config import GRPOConfig
from align.grpo.dynamic_sampling import group_has_signal, merge_batches
from align.grpo.prompts import check_completion_budget, prepare_prompts
from align.grpo.reward_funcs import build_rewards, required_reward_columns
from align.grpo.trainer import GRPOTrainer
from data_gen.tasks import make_tasks, prompt_messages, to_messages

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
FAMILIES = ["arithmetic", "compare", "count_items"]
NAN = float("nan")


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    """A tiny random Llama + our tokenizer (trained on task texts) saved to a dir."""
    from pretrain.tokenizer import train_tokenizer

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("grpo")
    rows = make_tasks(FAMILIES, num=120, split="train", seed=0)
    tok = train_tokenizer([m["content"] for r in rows for m in to_messages(r, "think")] * 3, vocab_size=400)
    return {"model": tiny_model(root / "model", tok, seed=0), "root": root, "tokenizer": tok}


class ScriptedEngine:
    """A RolloutEngine that samples random non-special tokens (no model): completions of random length that stop
    with the stop token, or run to max_new_tokens (finish "length") — so truncation is under the test's control.
    Records every call and every weight push."""

    def __init__(self, rollout_mod, vocab: range, truncate_every: int = 0, stop_without_token: bool = False):
        self.mod, self.vocab, self.truncate_every = rollout_mod, vocab, truncate_every
        self.stop_without_token = stop_without_token
        self.calls, self.pushed = [], []
        self.gen = torch.Generator().manual_seed(0)

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params))
        out = []
        for p in prompts:
            group = []
            for k in range(params.n):
                truncated = self.truncate_every and (len(self.calls) + k) % self.truncate_every == 0
                length = (
                    params.max_new_tokens
                    if truncated
                    else int(torch.randint(2, params.max_new_tokens, (1,), generator=self.gen))
                )
                ids = torch.randint(self.vocab.start, self.vocab.stop, (length,), generator=self.gen).tolist()
                if not truncated and not self.stop_without_token:
                    ids[-1] = params.stop_token_ids[0]
                # it draws uniformly over its vocabulary: that is the log-prob of what it sampled
                lps = [-math.log(len(self.vocab))] * len(ids) if getattr(params, "logprobs", False) else None
                group.append(self.mod.Rollout(list(p), ids, lps, "length" if truncated else "stop"))
            out.append(group)
        return out

    def update_weights(self, named_params):
        self.pushed.append({n: t.clone() for n, t in named_params})

    def close(self):
        pass


def _train_rows(n: int = 32) -> datasets.Dataset:
    rows = make_tasks(FAMILIES, num=n, split="train", seed=1)
    for r in rows:
        r["prompt_messages"] = prompt_messages(r, "no_think")
    return datasets.Dataset.from_list(rows)


def _args(out, **kw) -> GRPOConfig:
    base = dict(
        output_dir=str(out),
        max_steps=3,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        learning_rate=5e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=False,
        lr_scheduler_type="constant",
        reward_funcs=["math_reward"],
    )
    base.update(kw)
    return GRPOConfig(**base)


def _trainer(tiny, args, reward_funcs, engine, rows=None):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    train = prepare_prompts(rows if rows is not None else _train_rows(), args.prompt_mode)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train,
        processing_class=tiny["tokenizer"],
        engine=engine,
    )


def length_reward(completions, **kwargs):
    """Varies across random completions (their length), so every group carries signal."""
    return [len(c[0]["content"]) / 10 for c in completions]


# ----------------------------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    "rewards, g, expected",
    [
        ([1, 1, 0, 1], 2, [False, True]),
        ([0, 0, 0, 0.5, 0.5, 0.5], 3, [False, False]),
        ([0, 0, 1, 2, 2, 2], 3, [True, False]),
        ([NAN, 1, NAN, NAN], 2, [False, False]),  # one scored completion: no variance to learn from
        ([NAN, 1, 0, 1], 2, [False, True]),
        ([0.3] * 8, 4, [False, False]),  # identical floats: no signal, whatever the rounding
        ([1e-9, 0, 0, 0], 4, [False]),  # below the tolerance
    ],
)
def test_group_has_signal(rewards, g, expected):
    assert group_has_signal(torch.tensor(rewards, dtype=torch.float64), g).tolist() == expected


def test_group_has_signal_rejects_partial_groups():
    with pytest.raises(ValueError, match="num_generations=4"):
        group_has_signal(torch.zeros(6), 4)


def test_merge_batches_pads_and_recounts():
    a = {
        "prompt_ids": torch.tensor([[5, 6], [7, 8]]),
        "prompt_mask": torch.ones(2, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[1, 2, 3], [4, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "advantages": torch.tensor([1.0, -1.0]),
        "num_items_in_batch": torch.tensor(4),
    }
    b = {
        "prompt_ids": torch.tensor([[9, 9, 9]]),
        "prompt_mask": torch.ones(1, 3, dtype=torch.long),
        "completion_ids": torch.tensor([[7]]),
        "completion_mask": torch.tensor([[1]]),
        "advantages": torch.tensor([0.5]),
        "num_items_in_batch": torch.tensor(1),
    }
    m = merge_batches([(a, torch.tensor([1])), (b, torch.tensor([0]))], pad_token_id=0, gather=lambda t: t[None])
    assert m["prompt_ids"].tolist() == [[0, 7, 8], [9, 9, 9]]  # prompts left-padded
    assert m["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert m["completion_ids"].tolist() == [[4, 0, 0], [7, 0, 0]]  # completions right-padded
    assert m["completion_mask"].tolist() == [[1, 0, 0], [1, 0, 0]]
    assert m["advantages"].tolist() == [-1.0, 0.5]
    assert int(m["num_items_in_batch"]) == 2  # recounted from the kept rows


@pytest.mark.parametrize(
    "tokens, expected",
    [
        ([6, 2], [1.5, 0.5]),  # every token weighs 1/8 on every rank: the losses average to the global token mean
        ([4, 4], [1.0, 1.0]),
        ([5], [1.0]),  # one process: this rank's tokens
        ([3, 0, 1], [2.25, 0.0, 0.75]),
    ],
)
def test_merged_batches_count_every_ranks_tokens_for_trls_dapo_normaliser(tokens, expected):
    """Each simulated rank merges its kept rows; `num_items_in_batch` is every rank's loss tokens (TRL gathers the
    count), so TRL's dapo/cispo loss, sum(per-token loss) / (num_items_in_batch / num_processes), averaged over ranks
    is the mean over all tokens. A per-token loss of 1 makes each rank's loss its share of the tokens times W."""
    world = len(tokens)
    counts = torch.tensor(tokens)
    losses = []
    for n in tokens:
        width = max(tokens)
        mask = (torch.arange(width) < n).long()[None]
        part = {
            "prompt_ids": torch.tensor([[5]]),
            "prompt_mask": torch.ones(1, 1, dtype=torch.long),
            "completion_ids": torch.full((1, width), 7),
            "completion_mask": mask,
            "advantages": torch.ones(1),
        }
        merged = merge_batches([(part, torch.tensor([0]))], pad_token_id=0, gather=lambda t: counts)
        assert int(merged["num_items_in_batch"]) == sum(tokens)
        per_token_loss = torch.ones(1, width)
        normalizer = merged["num_items_in_batch"].clamp(min=1.0) / world  # TRL 1.16 `_compute_loss`, dapo/cispo
        losses.append(float((per_token_loss * merged["completion_mask"]).sum() / normalizer))
    assert losses == pytest.approx(expected)
    assert sum(losses) / world == pytest.approx(1.0)  # DDP averages the ranks' gradients: the global token mean


def test_prepare_prompts_modes_and_columns():
    rows = _train_rows(4)
    out = prepare_prompts(rows, prompt_mode="think", system_prompt="Be brief.")
    r = out[0]
    assert r["prompt"][0] == {"role": "system", "content": "Be brief. /think"}  # the no_think flag is replaced
    assert r["prompt"][1]["content"] == rows[0]["prompt"] and r["question"] == rows[0]["prompt"]
    assert r["mode"] == "think" and r["answer"] == rows[0]["answer"]
    assert "messages" not in out.column_names and "prompt_messages" not in out.column_names
    plain = prepare_prompts(datasets.Dataset.from_list([{"question": "2+2?", "answer": "4"}]))
    assert plain[0]["prompt"] == [{"role": "user", "content": "2+2?"}]
    with pytest.raises(ValueError, match="'question' column"):
        prepare_prompts(datasets.Dataset.from_list([{"text": "x"}]))


def test_unknown_reward_lists_registered_names(tmp_path):
    with pytest.raises(ValueError, match=r"unknown reward 'math_rewrd'.*Did you mean 'math_reward'.*Registered"):
        build_rewards(_args(tmp_path, reward_funcs=["math_rewrd"]))


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="rollout_backend 'vlm'"):
        _args(tmp_path, rollout_backend="vlm")
    with pytest.raises(ValueError, match="prompt_mode"):
        _args(tmp_path, prompt_mode="thinking")
    with pytest.raises(ValueError, match="loss_type 'ppo'"):
        _args(tmp_path, loss_type="ppo")
    with pytest.raises(ValueError, match="use_vllm=True"):
        _args(tmp_path, use_vllm=True)
    assert _args(tmp_path, prompt_mode="no_think").chat_template_kwargs == {"enable_thinking": False}


def test_outside_verifier_by_file_and_dotted_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    by_file = f"{FIXTURES / 'my_verifiers.py'}:palindrome_reward"
    args = _args(
        tmp_path,
        reward_funcs=[by_file, "my_verifiers:palindrome_reward", "soft_overlong_reward"],
        reward_kwargs={"soft_overlong_reward": {"max_completion_len": 10, "soft_punish_cache": 4}},
        reward_weights=[1.0, 0.5, 1.0],
    )
    funcs = build_rewards(args)
    assert [f.__name__ for f in funcs] == ["palindrome_reward", "palindrome_reward", "soft_overlong_reward"]
    assert [f(completions=["Never odd or even"])[0] for f in funcs[:2]] == [1.0, 1.0]
    assert args.reward_weights == [1.0, 0.5, 1.0]
    # what the dataset must provide: math_reward needs the gold answer, the palindrome nothing
    assert required_reward_columns(build_rewards(_args(tmp_path))[0]) == ["answer"]
    assert required_reward_columns(funcs[0]) == []


def test_completion_budget_refuses_a_length_that_zeroes_every_reward(tiny):
    rows = datasets.Dataset.from_list(make_tasks(FAMILIES, num=40, split="train"))
    stats = check_completion_budget(rows, tiny["tokenizer"], 256)
    assert stats["mode"] == "think" and 10 < stats["median"] <= stats["p95"] <= stats["max"] < 256
    with pytest.raises(ValueError, match="max_completion_length=8 is below the median"):
        check_completion_budget(rows, tiny["tokenizer"], 8)


def test_completion_budget_of_tool_rows_counts_every_turn_and_the_tools_replies(tiny):
    """A tool chain's gold trajectory (two searches, their replies, the calculator, its reply, the answer) is
    several times its answer: a budget that fits the answer alone zeroed every reward of a 135M GRPO run."""
    from data_gen.tool_tasks import make_tool_tasks

    tok = tiny["tokenizer"]
    chain = datasets.Dataset.from_list(make_tool_tasks(["tool_difference"], num=16, split="train"))
    one = datasets.Dataset.from_list(make_tool_tasks(["tool_lookup"], num=16, split="train"))
    long, short = check_completion_budget(chain, tok, 4096), check_completion_budget(one, tok, 4096)
    assert check_completion_budget(prepare_prompts(chain, "think"), tok, 4096) == long  # GRPO's prepared rows
    answer = max(len(tok(r["answer"], add_special_tokens=False)["input_ids"]) for r in chain)
    assert long["median"] > short["median"] > 4 * answer  # the turns and replies, not the answer alone
    with pytest.raises(ValueError, match="below the median gold think-mode answer"):
        check_completion_budget(chain, tok, (long["median"] + short["median"]) // 2)
    # a user's tool rows without a think trace, or with calls of another shape: checked as far as they allow
    no_think = chain.remove_columns(["think"])
    assert check_completion_budget(no_think, tok, 4096)["median"] < long["median"]
    odd = one.map(lambda r: {"calls": "not json"})
    assert check_completion_budget(odd, tok, 4096)["median"] < short["median"]  # the answers alone, with a warning


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"rollout_backend": "hf", "generation_kwargs": {"presence_penalty": 0.5}}, "hf engine samples with"),
        ({"generation_kwargs": {"n": 2}}, "num_generations"),
        ({"generation_kwargs": {"max_tokens": 9}}, "max_completion_length"),
        ({"generation_kwargs": {"seed": 1}}, "seed"),
    ],
)
def test_generation_kwargs_the_engine_cannot_take_are_one_line_errors(tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message) as err:
        _args(tmp_path, **knobs)
    assert "\n" not in str(err.value)


def test_trls_sampling_settings_reach_the_shared_engine(tiny, tmp_path):
    """min_p, repetition_penalty and generation_kwargs (its sampling knobs override the fields, as in TRL; the rest
    are vLLM SamplingParams arguments) are in the params the engine is called with; greedy evaluation stays plain.
    An hf engine chosen by `auto` refuses the vLLM-only ones as the trainer is built."""
    engine = ScriptedEngine(rollout, range(10, len(tiny["tokenizer"])))
    args = _args(
        tmp_path, min_p=0.05, repetition_penalty=1.2, top_k=20, generation_kwargs={"top_k": 7, "presence_penalty": 0.3}
    )
    trainer = _trainer(tiny, args, [length_reward], engine)
    trainer._generate_single_turn([[5, 6, 7]] * 4, None, None, 4)
    ((num_prompts, params),) = engine.calls
    assert (num_prompts, params.n, params.min_p, params.repetition_penalty, params.top_k) == (1, 4, 0.05, 1.2, 7)
    assert params.vllm_kwargs == {"presence_penalty": 0.3} and params.temperature == args.temperature
    greedy = trainer.sampling_params(1, greedy=True)
    assert (greedy.temperature, greedy.min_p, greedy.repetition_penalty, greedy.vllm_kwargs) == (0.0, 0.0, 1.0, {})
    with pytest.raises(ValueError, match="presence_penalty"):
        _trainer(tiny, args, [length_reward], rollout.get_engine(_model(tiny), backend="hf"))


# ----------------------------------------------------------------------------------------------- training


def test_grpo_steps_rewards_columns_params_and_sync(tiny, tmp_path, monkeypatch):
    mod = rollout
    seen = []

    def recording_reward(completions, answer, family, prompts, **kwargs):
        seen.append((len(completions), list(answer), list(family), [p[-1]["content"] for p in prompts]))
        return length_reward(completions)

    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])))
    rows = _train_rows()
    trainer = _trainer(tiny, _args(tmp_path), [recording_reward], engine, rows)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    # rewards got the dataset's columns, row-aligned with the prompts (gold answer of that very question)
    by_question = {r["prompt"]: (r["answer"], r["family"]) for r in rows}
    assert len(seen) == 3
    for n, answers, families, questions in seen:
        assert n == 8
        assert [by_question[q] for q in questions] == list(zip(answers, families))
    # one engine call per step, each unique prompt once with n = num_generations (prefill shared)
    assert [(num, p.n, p.max_new_tokens) for num, p in engine.calls] == [(2, 4, 12)] * 3
    assert engine.calls[0][1].stop_token_ids[0] == tiny["tokenizer"].eos_token_id
    # the engine holds its own weights: pushed before every step (the first too: a cached engine may be stale),
    # with the model's weights of that moment
    assert len(engine.pushed) == 3
    after = dict(trainer.model.named_parameters())
    assert set(engine.pushed[-1]) == set(after)
    assert all(torch.equal(engine.pushed[0][n], before[n]) for n in before)
    changed = [n for n, p in after.items() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before), f"unchanged: {set(before) - set(changed)}"
    logs = trainer.state.log_history
    assert any("rewards/recording_reward/mean" in h for h in logs)


def test_hf_engine_sharing_the_model_needs_no_sync(tiny, tmp_path, monkeypatch):
    mod = rollout
    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])))
    trainer = _trainer(tiny, _args(tmp_path, max_steps=2), [length_reward], engine)
    engine.model = trainer.model  # what the hf backend does: it generates with the trained model object
    trainer.train()
    assert trainer.engine_shares_model() and engine.pushed == [] and len(engine.calls) == 2


def test_dynamic_sampling_drops_zero_variance_groups(tiny, tmp_path, monkeypatch):
    mod = rollout

    def family_reward(completions, family, **kwargs):
        # compare-family prompts always score 1 (no variance); the others vary with the completion
        return [1.0 if f == "compare" else d for f, d in zip(family, length_reward(completions))]

    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])))
    trainer = _trainer(
        tiny,
        _args(
            tmp_path,
            dynamic_sampling=True,
            per_device_train_batch_size=12,
            num_generations=4,
            dynamic_sampling_max_rounds=4,
        ),
        [family_reward],
        engine,
    )
    trainer.model.train()
    rows = [dict(r) for r in trainer.train_dataset.filter(lambda r: r["family"] == "compare").select([0, 1])]
    rows += [dict(trainer.train_dataset.filter(lambda r: r["family"] != "compare")[0])]
    inputs = [dict(r) for r in rows for _ in range(4)]  # 3 groups, 2 of them without signal
    out = trainer._generate_and_score_completions(inputs)
    assert out["advantages"].shape == (12,) and out["completion_ids"].shape[0] == 12
    assert len(engine.calls) >= 2  # refilled from fresh prompts
    # every kept group has signal: its advantages are not all zero
    assert (out["advantages"].view(3, 4).abs().sum(dim=1) > 0).all()
    assert trainer._metrics["train"]["dynamic_sampling/kept_ratio"][-1] == 1.0
    assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())


@pytest.mark.parametrize("mask", [True, False])
def test_truncated_completions_are_masked(tiny, tmp_path, monkeypatch, mask):
    mod = rollout
    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])), truncate_every=2)
    trainer = _trainer(tiny, _args(tmp_path, mask_truncated_completions=mask), [length_reward], engine)
    trainer.model.train()
    inputs = [dict(trainer.train_dataset[i // 4 * 4]) for i in range(8)]
    out = trainer._generate_and_score_completions(inputs)
    eos = tiny["tokenizer"].eos_token_id
    lengths = out["completion_mask"].sum(dim=1)
    ids = out["completion_ids"]
    ended = torch.tensor([(row[:12] == eos).any().item() for row in ids])
    assert ended.any() and (~ended).any()
    if mask:  # truncated rows drop out of the loss entirely; stopped rows keep all their tokens
        assert (lengths[~ended] == 0).all() and (lengths[ended] > 0).all()
    else:
        assert (lengths[~ended] == 12).all()


def test_stop_without_stop_token_is_not_called_truncated(tiny, tmp_path, monkeypatch):
    """An engine that strips the stop token: we put it back, or TRL would count (and mask) it as truncated."""
    mod = rollout
    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])), stop_without_token=True)
    trainer = _trainer(tiny, _args(tmp_path, mask_truncated_completions=True), [length_reward], engine)
    trainer.model.train()
    out = trainer._generate_and_score_completions([dict(trainer.train_dataset[0]) for _ in range(8)])
    assert (out["completion_mask"].sum(dim=1) > 0).all()


def test_overlong_penalty_pushes_long_completions_down(tiny, tmp_path, monkeypatch):
    """soft_overlong_reward sees token lengths (TRL's completion_ids): completions past the budget get negative
    advantages, those within it positive; the `mode` column from prompt_mode picks the budget."""
    mod = rollout
    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])))
    args = _args(
        tmp_path,
        prompt_mode="no_think",
        max_completion_length=12,
        reward_funcs=["soft_overlong_reward"],
        reward_kwargs={
            "soft_overlong_reward": {
                "max_completion_len": 6,
                "soft_punish_cache": 2,
                "think_max_completion_len": 100,
                "think_soft_punish_cache": 2,
            }
        },
    )
    trainer = _trainer(tiny, args, build_rewards(args), engine)
    trainer.model.train()
    out = trainer._generate_and_score_completions([dict(trainer.train_dataset[i // 4 * 4]) for i in range(8)])
    lengths = out["completion_mask"].sum(dim=1)
    adv = out["advantages"]
    rewards = trainer._weighted_rewards()
    assert torch.equal(rewards <= -1.0, lengths >= 6) and torch.equal(rewards == 0.0, lengths <= 4)
    for g in range(2):  # within each group with signal: every over-budget completion is below every short one
        grp = slice(4 * g, 4 * g + 4)
        long, short = adv[grp][lengths[grp] >= 6], adv[grp][lengths[grp] <= 4]
        if len(long) and len(short):
            assert long.max() < 0 < short.min()


def test_mixed_mode_batches_log_reward_accuracy_format_and_length_per_asked_mode(tiny, tmp_path):
    """Hybrid reasoning: think and no_think prompts in one batch, each row judged by its asked mode
    (mode_format_reward, per-mode overlong budgets) and every per-mode metric logged; `mode/<m>/length` is the mean
    completion length of that mode's rows and `mode/<m>/reward` the weighted total over them."""
    rows = make_tasks(FAMILIES, num=16, split="train", seed=3)
    for i, r in enumerate(rows):
        r["prompt_messages"] = prompt_messages(r, "think" if i % 2 else "no_think")
    engine = ScriptedEngine(rollout, range(10, len(tiny["tokenizer"])))
    args = _args(
        tmp_path,
        max_completion_length=12,
        reward_funcs=["math_reward", "mode_format_reward", "soft_overlong_reward"],
        reward_weights=[1, 0.5, 1],
        reward_kwargs={
            "soft_overlong_reward": {
                "max_completion_len": 6,
                "soft_punish_cache": 2,
                "think_max_completion_len": 12,
                "think_soft_punish_cache": 2,
            }
        },
    )
    trainer = _trainer(tiny, args, build_rewards(args), engine, rows=datasets.Dataset.from_list(rows))
    trainer.model.train()
    batch = [dict(trainer.train_dataset[i // 4 * 4 + (i // 4) % 2]) for i in range(16)]  # 2 groups of each mode
    out = trainer._generate_and_score_completions(batch)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("mode/")}
    assert {
        f"mode/{m}/{k}"
        for m in ("think", "no_think")
        for k in ("reward", "accuracy", "format", "length", "soft_overlong_reward")
    } <= set(logged)
    lengths = out["completion_mask"].sum(dim=1).float()
    modes = [r["mode"] for r in batch]
    for m in ("think", "no_think"):
        mine = torch.tensor([x == m for x in modes])
        assert logged[f"mode/{m}/length"] == pytest.approx(lengths[mine].mean().item())
        assert logged[f"mode/{m}/reward"] == pytest.approx(trainer._weighted_rewards()[mine].mean().item())
    # the same lengths cost the no_think rows more: their budget is half the think one
    assert logged["mode/no_think/soft_overlong_reward"] < logged["mode/think/soft_overlong_reward"]
    assert logged["mode/think/format"] == 0.0  # random tokens never reason in a think block


def test_a_form_gated_reward_alone_still_logs_each_modes_accuracy_from_the_rows_verifier(tiny, tmp_path):
    """With `mode_math_reward` as the only reward no accuracy verifier is among the rewards: `mode/<m>/accuracy`
    comes from each row's own verifier (`verifier_scores`), not from the gated reward."""
    rows = make_tasks(FAMILIES, num=16, split="train", seed=3)
    for i, r in enumerate(rows):
        r["prompt_messages"] = prompt_messages(r, "think" if i % 2 else "no_think")
    args = _args(tmp_path, max_completion_length=12, reward_funcs=["mode_math_reward"])
    trainer = _trainer(
        tiny,
        args,
        build_rewards(args),
        ScriptedEngine(rollout, range(10, len(tiny["tokenizer"]))),
        rows=datasets.Dataset.from_list(rows),
    )
    trainer.model.train()
    batch = [dict(trainer.train_dataset[i // 4 * 4 + (i // 4) % 2]) for i in range(16)]
    trainer._generate_and_score_completions(batch)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("mode/")}
    assert {"mode/think/accuracy", "mode/no_think/accuracy", "mode/think/mode_math_reward"} <= set(logged)
    assert logged["mode/think/accuracy"] == logged["mode/no_think/accuracy"] == 0.0  # random tokens answer nothing


# ----------------------------------------------------------------------------------------------- end to end


def test_cli_end_to_end_with_outside_verifier(tiny, tmp_path, monkeypatch):
    """scripts/grpo.py on a recipe: a dotted-path verifier is called and logged, the model saves and reloads."""
    from scripts_grpo import CONFIG_TYPES  # noqa: I001  (scripts/ is not a package: imported by path below)

    from align.cli import run
    from align.grpo.trainer import main
    from align.eval.statistics import paired_change

    monkeypatch.syspath_prepend(str(FIXTURES))
    out = tmp_path / "run"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "# python scripts/grpo.py r.yaml\n"
        f"model_name_or_path: {tiny['model']}\n"
        "dataset_name: builtin:tasks\n"
        "dataset_args: {families: [arithmetic, compare], num: 16, mode: think}\n"
        f"output_dir: {out}\nmax_steps: 2\nper_device_train_batch_size: 4\nnum_generations: 2\n"
        "max_completion_length: 24\nlogging_steps: 1\nsave_strategy: 'no'\nbf16: false\n"
        "reward_funcs: [math_reward, 'my_verifiers:palindrome_reward']\n"
        "reward_kwargs: {palindrome_reward: {min_length: 2}}\n"
        "rollout_backend: hf\n"
        "eval_num_prompts: 4\nprompt_mode: no_think\n"  # no_think: the 24-token budget fits the answers
    )
    report = run(main, *CONFIG_TYPES, args=[str(recipe)])
    logged = [h for h in report["log_history"] if "rewards/palindrome_reward/mean" in h]
    assert len(logged) == 2 and all(0.0 <= h["rewards/palindrome_reward/mean"] <= 1.0 for h in logged)
    saved = json.loads((out / "grpo_eval.json").read_text())
    assert saved["rewards"] == ["math_reward", "palindrome_reward"]
    assert saved["completion_budget"]["mode"] == "no_think"
    assert 0.0 <= saved["after"]["accuracy"] <= 1.0 and saved["after"]["num_prompts"] == 4
    by = saved["after"]["by_family"]  # task rows: accuracy per family, the overall one lies between them
    assert set(by) <= {"arithmetic", "compare"} and min(by.values()) <= saved["after"]["accuracy"] <= max(by.values())
    before, after = saved["before"]["correct"], saved["after"]["correct"]  # per prompt, the same 4 prompts
    assert len(before) == len(after) == 4 and sum(after) / 4 == saved["after"]["accuracy"]
    assert saved["paired"]["gained"] - saved["paired"]["lost"] == sum(after) - sum(before)
    assert saved["paired"] == paired_change(before, after)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    from scripts_grpo import CONFIG_TYPES

    from align.cli import run
    from align.grpo.trainer import main

    base = ["--model_name_or_path", tiny["model"], "--dataset_name", "builtin:tasks", "--output_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        run(main, *CONFIG_TYPES, args=[*base, "--reward_funcs", "palindrom_reward"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 1 and "unknown reward 'palindrom_reward'" in err and "math_reward" in err
    data = tmp_path / "questions.jsonl"  # no gold `answer` column: math_reward cannot score it
    data.write_text('{"question": "What is 2 + 2?"}\n' * 4)
    with pytest.raises(SystemExit) as e:
        run(main, *CONFIG_TYPES, args=[*base[:2], "--dataset_name", str(data), "--output_dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 1 and "grpo needs column(s) 'answer'" in err


@pytest.fixture(autouse=True, scope="module")
def _scripts_grpo_module():
    """Import scripts/grpo.py as `scripts_grpo` (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scripts_grpo", REPO / "scripts" / "grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["scripts_grpo"] = module
    yield
    sys.modules.pop("scripts_grpo", None)


# ----------------------------------------------------------------------------------------------- importance sampling


class TemperedEngine:
    """An engine with its own copy of the weights that samples at another temperature than the trainer on purpose
    (a stand-in for an inference engine whose numerics differ) and reports its sampling log-probs."""

    backend = "custom"

    def __init__(self, model, temperature: float):
        import copy

        from align.rollout.hf import HFEngine

        self.inner = HFEngine(copy.deepcopy(model))
        self.model = None  # its own copy: weights are pushed, importance sampling applies
        self.temperature, self.asked = temperature, []

    def generate(self, prompts, params):
        self.asked.append(params)
        return self.inner.generate(prompts, dataclasses.replace(params, temperature=self.temperature))

    def update_weights(self, named):
        self.inner.update_weights(named)

    def close(self):
        pass


def _is_metric(trainer, name: str) -> list[float]:
    return [h[name] for h in trainer.state.log_history if name in h]


def test_importance_sampling_is_a_no_op_when_engine_and_trainer_agree(tiny, tmp_path):
    def run(correction: bool):
        args = _args(
            tmp_path / str(correction), max_steps=2, temperature=1.0, vllm_importance_sampling_correction=correction
        )
        trainer = _trainer(tiny, args, [length_reward], TemperedEngine(_model(tiny), temperature=1.0))
        trainer.train()
        return trainer

    corrected, plain = run(True), run(False)
    assert corrected.importance_sampling and not plain.importance_sampling
    assert corrected.engine.asked[0].logprobs and corrected.engine.asked[0].logprobs_kind == "sampling"
    ratio = _is_metric(corrected, "sampling/importance_sampling_ratio/mean")
    assert ratio and all(abs(r - 1) < 1e-4 for r in ratio)  # the engine samples from the trainer's distribution
    assert _is_metric(corrected, "loss") == pytest.approx(_is_metric(plain, "loss"), rel=1e-4, abs=1e-6)


def test_importance_sampling_corrects_an_engine_that_samples_another_distribution(tiny, tmp_path):
    args = _args(
        tmp_path,
        max_steps=2,
        temperature=1.0,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=3.0,
    )
    trainer = _trainer(tiny, args, [length_reward], TemperedEngine(_model(tiny), temperature=2.0))
    trainer.train()
    low, mean, high = (_is_metric(trainer, f"sampling/importance_sampling_ratio/{k}") for k in ("min", "mean", "max"))
    assert min(low) < 0.9 and max(high) > 1.1  # a hotter engine: its tokens are over- and under-weighted
    assert all(h <= 3.0 + 1e-6 for h in high)  # truncated at the cap
    assert _is_metric(trainer, "sampling/sampling_logp_difference/mean")[0] > 0


def test_the_ratio_built_in_the_loss_pass_equals_trls_own_pass_which_is_skipped(tiny, tmp_path):
    """Aligned generation and optimisation: the loss pass's detached log-probs are the old log-probs, so the extra
    no-grad forward TRL runs for them is skipped; losses and the logged correction are TRL's, to float precision."""

    def run(defer: bool):
        args = _args(
            tmp_path / str(defer),
            max_steps=2,
            temperature=1.0,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="token_truncate",
            vllm_importance_sampling_clip_max=3.0,
        )
        trainer = _trainer(tiny, args, [length_reward], TemperedEngine(_model(tiny), temperature=2.0))
        trainer.defer_importance_sampling = defer
        passes = []
        inner = trainer._get_per_token_logps_and_entropies

        def counted(*a, **k):
            passes.append(torch.is_grad_enabled())
            return inner(*a, **k)

        trainer._get_per_token_logps_and_entropies = counted
        trainer.train()
        return trainer, passes

    (ours, our_passes), (trls, trl_passes) = run(True), run(False)
    assert our_passes.count(False) == 0 and trl_passes.count(False) == 2  # one no-grad pass per generation batch
    assert our_passes.count(True) == trl_passes.count(True) == 2
    for name in (
        "loss",
        "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/max",
        "sampling/importance_sampling_ratio/mean",
        "sampling/sampling_logp_difference/mean",
    ):
        assert _is_metric(ours, name) == pytest.approx(_is_metric(trls, name), rel=1e-4, abs=1e-6), name
    assert min(_is_metric(ours, "sampling/importance_sampling_ratio/min")) < 0.9  # the correction is really applied


def test_a_vllm_engine_on_a_cpu_samples_in_the_trainers_precision_and_hf_keeps_sharing_the_model(
    tiny, tmp_path, keep_bf16
):
    from align.grpo.trainer import rollout_knobs

    model = _model(tiny)
    bf16 = _args(tmp_path, bf16=True)
    assert rollout_knobs(bf16, model) == {}  # auto -> hf for a tiny model: it shares the trained model, no copy
    bf16.rollout_backend = "vllm"
    assert rollout_knobs(bf16, model) == ({} if torch.cuda.is_available() else {"dtype": "bfloat16"})
    bf16.rollout_kwargs = {"dtype": "float32", "kv_cache_gib": 1}
    assert rollout_knobs(bf16, model) == {"dtype": "float32", "kv_cache_gib": 1}  # the recipe's word wins
    fp32 = _args(tmp_path, bf16=False, rollout_backend="vllm")
    assert rollout_knobs(fp32, model) == {}
    # TRL's cast_lm_head_to_fp32 (the trainer's head in fp32): a vLLM engine projects through its head in fp32 too
    head = _args(tmp_path, bf16=True, rollout_backend="vllm", cast_lm_head_to_fp32=True)
    assert rollout_knobs(head, model)["head_dtype"] == "float32"
    head.rollout_backend = "hf"  # the hf engine shares the trained model: its head is the trainer's
    assert "head_dtype" not in rollout_knobs(head, model)


def test_a_shared_hf_engine_samples_outside_the_bf16_autocast_and_importance_sampling_corrects_it(
    tiny, tmp_path, keep_bf16
):
    """On a CPU the hf engine that shares the trained model samples in its fp32 weights while the trainer computes
    under accelerate's bf16 autocast (align.rollout.hf): a small, real mismatch, corrected in the loss pass (no
    no-grad pass). Without mixed precision the engine samples what the trainer computes: no correction."""
    from align import stage
    from align.rollout.sampler import build_sampler

    def run(bf16: bool):
        args = _args(
            tmp_path / str(bf16),
            max_steps=2,
            temperature=1.0,
            bf16=bf16,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="token_truncate",
        )
        trainer = _trainer(tiny, args, [length_reward], None)
        trainer.sampler = build_sampler(
            "hf", {}, trainer.model, tiny["model"], tiny["tokenizer"], trainer.accelerator, logprobs_kind="sampling"
        )
        assert trainer.sampler.shares(trainer.model) and not trainer.importance_sampling  # no autocast before train()
        passes, trainer.attention = [], set()
        inner = trainer._get_per_token_logps_and_entropies

        def counted(*a, **k):
            passes.append(torch.is_grad_enabled())
            trainer.attention.add(trainer.model.config._attn_implementation)
            return inner(*a, **k)

        trainer._get_per_token_logps_and_entropies = counted
        stage.train(trainer, args)  # as align.grpo.trainer.main trains
        assert trainer.model.config._attn_implementation == "sdpa"  # restored after training
        return trainer, passes

    (mixed, mixed_passes), (plain, plain_passes) = run(True), run(False)
    assert mixed.attention == plain.attention == {"sdpa_cpu_fp32"}  # the loss pass (align/modeling/cpu_attention.py)
    assert mixed.importance_sampling and mixed.engine.bypasses_autocast()
    low, high = (
        _is_metric(mixed, "sampling/importance_sampling_ratio/min"),
        _is_metric(mixed, "sampling/importance_sampling_ratio/max"),
    )
    assert len(low) == 2 and min(low) < 1 < max(high)  # bf16 vs fp32: a real difference, corrected
    assert min(low) > 0.9 and max(high) < 1.1  # and a small one
    assert 0 < _is_metric(mixed, "sampling/sampling_logp_difference/mean")[0] < 0.05
    assert mixed_passes.count(False) == 0  # the ratio comes from the loss pass
    assert not plain.importance_sampling and not plain.engine.bypasses_autocast()
    assert not _is_metric(plain, "sampling/importance_sampling_ratio/mean") and plain_passes.count(False) == 0


def test_sampling_logprobs_are_those_of_the_distribution_drawn_from():
    """The estimator the correction relies on: tokens drawn by the engine at temperature 2 and top-k 6, weighted by
    p/q with q the log-prob the engine reports, average what the trainer's own distribution p averages."""
    from align.rollout import SamplingParams
    from align.rollout.hf import sample_next

    torch.manual_seed(0)
    logits = torch.randn(1, 10) * 2
    p = logits.softmax(-1)[0]  # the trainer's distribution (temperature 1, no top-k)
    f = torch.arange(10.0)  # any per-token quantity, e.g. a reward
    params = SamplingParams(temperature=2.0, top_k=6, logprobs_kind="sampling")
    gen = torch.Generator().manual_seed(0)
    draws = [sample_next(logits, params, gen) for _ in range(20000)]
    tokens = torch.tensor([t.item() for t, _ in draws])
    q = torch.tensor([lp.item() for _, lp in draws]).exp()
    freq = torch.bincount(tokens, minlength=10).float() / len(tokens)
    assert torch.allclose(freq[tokens], q, atol=0.02)  # the reported log-prob is the one it sampled with
    kept = freq > 0  # top-k: p's mass outside the engine's support cannot be recovered, only re-weighted inside it
    ratio = p[tokens] / q
    target = float((p * f)[kept].sum())
    assert float((ratio * f[tokens]).mean()) == pytest.approx(target, rel=0.05)
    assert abs(float(f[tokens].mean()) - target) > 0.3  # uncorrected, the engine's distribution shows


def _model(tiny):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny["model"])


def _padded_rl_batch(vocab: int, prompts: list[int], completions: list[int], seed: int = 0):
    """TRL's GRPO layout: prompts left-padded, completions right-padded; attention_mask 0 on padding."""
    g = torch.Generator().manual_seed(seed)
    pw, cw = max(prompts), max(completions)
    ids = torch.randint(3, vocab, (len(prompts), pw + cw), generator=g)
    mask = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        mask[b, pw - p : pw + c] = 1
    return ids.masked_fill(mask == 0, 0), mask, cw


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_a_padding_free_pass_gives_the_padded_passs_logprobs_entropies_and_gradients(tiny, gradient_checkpointing):
    """align/grpo/packing.py: every sequence's real tokens in one row (position ids restarting, per-sequence attention,
    labels shifted inside each sequence) give TRL's padded pass's per-token log-probs and entropies in its
    (rows, logits_to_keep) layout, zeros where a row has no token, and the same gradients (the backward re-runs the
    forward under gradient checkpointing: the per-sequence attention must hold there too)."""
    import contextlib
    import types

    import trl
    from transformers import AutoModelForCausalLM
    from trl.trainer import utils as trl_utils

    from align.grpo.packing import pack, packed_attention, packed_logps

    padded_pass = getattr(
        trl.GRPOTrainer._get_per_token_logps_and_entropies,
        "__wrapped__",
        trl.GRPOTrainer._get_per_token_logps_and_entropies,
    )  # without TRL's profiling wrapper
    model = AutoModelForCausalLM.from_pretrained(tiny["model"], attn_implementation="sdpa")
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    model.train()
    ids, mask, keep = _padded_rl_batch(model.config.vocab_size, prompts=[5, 9, 3, 7], completions=[11, 2, 6, 1])
    packed = pack(ids, mask, keep)
    assert packed["input_ids"].shape == (1, int(mask.sum())) and int((packed["shift_labels"] != -100).sum()) == 20

    def run(padding_free: bool):
        model.zero_grad()
        if padding_free:
            with packed_attention(model):
                lp, ent = packed_logps(model, ids, mask, keep, compute_entropy=True)
                (lp.sum() + 0.1 * ent.sum()).backward()
        else:
            fake = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext))
            lp, ent, _ = padded_pass(fake, model, ids, mask, keep, compute_entropy=True)
            (lp * mask[:, -keep:]).sum().add(0.1 * (ent * mask[:, -keep:]).sum()).backward()
            lp, ent = lp * mask[:, -keep:], ent * mask[:, -keep:]  # TRL's loss masks these positions
        return (
            lp.detach(),
            ent.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )

    padded_lp, padded_ent, padded_grads = run(False)
    packed_lp, packed_ent, packed_grads = run(True)
    assert packed_lp.shape == padded_lp.shape == (4, keep)
    torch.testing.assert_close(packed_lp, padded_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_ent, padded_ent, rtol=1e-5, atol=1e-5)
    assert (packed_lp[mask[:, -keep:] == 0] == 0).all() and (packed_lp[mask[:, -keep:] == 1] != 0).all()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    assert model.config._attn_implementation == "sdpa"  # the model's own attention again after the pass


def test_chunked_padding_free_passes_give_trls_chunked_padded_logprobs():
    """TRL chunks its reference and old-log-prob passes by `per_device_train_batch_size`; the padding-free pass packs
    each chunk into its own row under one attention context. Chunks with equal real-token counts and other sequence
    boundaries must each get their own layout: every chunk's log-probs equal TRL's padded pass's, batch after batch
    (the allocator often lays a chunk's position ids where the previous chunk's lay)."""
    import contextlib
    import types

    import trl
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer import utils as trl_utils

    from align.grpo.loss import LossPassImportanceSampling

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config).eval()
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    padded_pass = getattr(
        trl.GRPOTrainer._get_per_token_logps_and_entropies,
        "__wrapped__",
        trl.GRPOTrainer._get_per_token_logps_and_entropies,
    )  # without TRL's profiling wrapper
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext),
        args=types.SimpleNamespace(padding_free=True),
        _pending_importance=None,
    )
    trainer._padding_free = lambda a, k: LossPassImportanceSampling._padding_free(trainer, a, k)

    def ours_pass(trainer, model, ids, mask, keep, **kwargs):  # what align.grpo.trainer.GRPOTrainer's override runs
        def trl_logps(*a, **k):
            return padded_pass(trainer, *a, **k)

        return LossPassImportanceSampling.loss_pass_logps(trainer, trl_logps, model, ids, mask, keep, (), kwargs)

    g = torch.Generator().manual_seed(0)
    chunk, num_chunks = 2, 8
    for _ in range(10):
        total = int(torch.randint(40, 60, (1,), generator=g))  # every chunk holds `total` real tokens
        prompts, completions = [], []
        for _ in range(num_chunks):
            first = int(torch.randint(2, total - 1, (1,), generator=g))
            for length in (first, total - first):
                p = int(torch.randint(1, length, (1,), generator=g))
                prompts.append(p)
                completions.append(length - p)
        ids, mask, keep = _padded_rl_batch(64, prompts, completions, seed=total)
        with torch.no_grad():
            theirs = padded_pass(trainer, model, ids, mask, keep, batch_size=chunk)[0] * mask[:, -keep:]
            ours = ours_pass(trainer, model, ids, mask, keep, batch_size=chunk)[0]
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_padding_free_grpo_trains_as_the_padded_trainer(tiny, tmp_path, beta, monkeypatch):
    """`padding_free: true`: the same engine samples (scripted, completions of random length), and the per-step
    losses, rewards and the trained weights equal the padded trainer's (the reference model's pass too, beta > 0)."""
    import align.grpo.loss as importance

    packed_rows = []
    real = importance.packed_logps
    monkeypatch.setattr(
        importance,
        "packed_logps",
        lambda model, ids, *a, **k: packed_rows.append(len(ids)) or real(model, ids, *a, **k),
    )
    runs = {}
    for padding_free in (False, True):
        engine = ScriptedEngine(rollout, range(10, len(tiny["tokenizer"])))
        trainer = _trainer(
            tiny,
            _args(tmp_path / str(padding_free), padding_free=padding_free, beta=beta, max_completion_length=24),
            [length_reward],
            engine,
        )
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        runs[padding_free] = logs, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    (padded, w_padded), (packed, w_packed) = runs[False], runs[True]
    assert len(padded) == len(packed) == 3
    assert sum(packed_rows) == 3 * 8 * (2 if beta else 1)  # every row of every step packed (+ the reference pass)
    for a, b in zip(padded, packed, strict=True):
        assert b["reward"] == a["reward"] and b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        if beta:
            assert b["kl"] == pytest.approx(a["kl"], rel=1e-3, abs=1e-6)
    # Adam at lr 5e-2 turns summation-order noise in a near-zero gradient into up to one step's size, so the
    # weights agree to a fraction of one step (1e-3 = 2%), not to rounding
    for name, weight in w_padded.items():
        torch.testing.assert_close(w_packed[name], weight, rtol=0, atol=1e-3, msg=name)
