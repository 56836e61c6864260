"""data_gen/preferences.py: strong-vs-weak and verifier-graded pairs, filters and their counts, per-model chat
templates, resume without duplicates, output formats and the card.

Models are stood in by scripted engines (the rollout protocol: token ids in, Rollouts out) that answer from a
table, so every filter is hit a known number of times; one test runs real tiny models when align.rollout exists.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from align.config import ScriptArguments
from data_gen import preferences as prefs
from data_gen.preferences import Generator, PreferenceDataConfig, generate_preferences
from data_gen.tasks import make_tasks

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


@dataclass
class _Rollout:
    prompt_ids: list
    completion_ids: list
    logprobs: list
    finish_reason: str


@pytest.fixture(scope="module")
def tok():
    from pretrain.tokenizer import train_tokenizer

    texts = [r["prompt"] + " The answer is \\boxed{" + r["answer"] + "}." for r in make_tasks(num=200, seed=5)]
    return train_tokenizer(texts, vocab_size=400)


class ScriptedEngine:
    """Answers each prompt from `answer(question, sample_index)`; records the prompt texts it was sent."""

    def __init__(self, tokenizer, answer, fail_after_calls: int | None = None):
        self.tok, self.answer, self.fail_after = tokenizer, answer, fail_after_calls
        self.seen: list[str] = []
        self.calls = 0

    def generate(self, prompts, params):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated interruption")
        self.calls += 1
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            self.seen.append(text)
            question = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text, re.S)[-1]
            group = []
            for k in range(params.n):
                ids_out = self.tok(self.answer(question, k), add_special_tokens=False)["input_ids"]
                ids_out += [self.tok.convert_tokens_to_ids("<|im_end|>")]
                group.append(_Rollout(ids, ids_out, [0.0] * len(ids_out), "stop"))
            out.append(group)
        return out

    def close(self):
        pass


def _rows(num=12, split="test"):
    return make_tasks(["arithmetic", "compare"], num=num, split=split, seed=0)


def _cfg(tmp_path, **kw):
    base = dict(strong_model="strong", weak_model="weak", output_dir=str(tmp_path / "out"), batch_size=4)
    base.update(kw)
    return PreferenceDataConfig(**base)


def _boxed(x) -> str:
    return f"The answer is \\boxed{{{x}}}."


def test_strong_weak_filters_and_counts(tmp_path, tok):
    rows = _rows(12)
    gold = {r["prompt"]: r["answer"] for r in rows}
    order = [r["prompt"] for r in rows]

    def strong(q, k):  # prompts 0-5 right, 6-7 empty, 8-9 wrong, 10-11 same as weak
        i = order.index(q)
        return _boxed(gold[q]) if i < 6 else "" if i < 8 else _boxed(int(gold[q]) + 5) if i < 10 else "no idea"

    def weak(q, k):
        return "no idea"

    gens = {
        "strong": Generator("strong-m", ScriptedEngine(tok, strong), tok, "think"),
        "weak": Generator("weak-m", ScriptedEngine(tok, weak), tok, "no_think"),
    }
    card = generate_preferences(_cfg(tmp_path, weak_mode="no_think"), {"test": rows}, gens)
    c = card["counts"]["test"]
    assert {k: c[k] for k in ("prompts", "kept", "empty", "chosen_wrong", "identical")} == {
        "prompts": 12,
        "kept": 6,
        "empty": 2,
        "chosen_wrong": 2,
        "identical": 2,
    }
    pairs = [json.loads(x) for x in (tmp_path / "out" / "test.jsonl").read_text().splitlines()]
    assert [p["prompt"][-1]["content"] for p in pairs] == order[:6]
    for p in pairs:
        assert p["prompt"][0] == {"role": "system", "content": "/think"}  # prompt_mode defaults to strong_mode
        assert p["chosen"] == [{"role": "assistant", "content": _boxed(gold[p["prompt"][-1]["content"]])}]
        assert p["rejected"][0]["content"] == "no idea"
        assert (p["chosen_score"], p["rejected_score"], p["chosen_model"]) == (1.0, 0.0, "strong-m")
        assert p["answer"] == gold[p["prompt"][-1]["content"]] and p["family"] in ("arithmetic", "compare")
    # each model saw the prompt in its own mode: the no_think generation prompt opens an empty think block
    assert all("/think" in s and "<think>\n\n</think>" not in s for s in gens["strong"].engine.seen)
    assert all("/no_think" in s and s.endswith("<think>\n\n</think>\n") for s in gens["weak"].engine.seen)
    saved = json.loads((tmp_path / "out" / "card.json").read_text())
    assert saved["counts"]["test"]["kept"] == 6 and "| test | 12 | 6 |" in (tmp_path / "out" / "README.md").read_text()


def test_each_model_keeps_its_own_chat_template(tmp_path, tok):
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(
        tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    other.chat_template = (TEMPLATES / "chatml_default_system.jinja").read_text()
    rows = _rows(4)
    gens = {
        "strong": Generator("s", ScriptedEngine(tok, lambda q, k: "A"), tok, "no_think"),
        "weak": Generator("w", ScriptedEngine(other, lambda q, k: "B"), other, "none"),
    }
    generate_preferences(
        _cfg(tmp_path, verify_chosen=False, strong_mode="no_think", weak_mode="none"), {"test": rows}, gens
    )
    strong_seen, weak_seen = gens["strong"].engine.seen[0], gens["weak"].engine.seen[0]
    assert strong_seen.startswith("<|im_start|>system\n/no_think<|im_end|>")
    assert "/think" not in weak_seen and "/no_think" not in weak_seen  # mode "none": no flag for a foreign model
    assert weak_seen != strong_seen and rows[0]["prompt"] in weak_seen


def test_graded_pairs_best_vs_worst_and_all_equal_dropped(tmp_path, tok):
    rows = _rows(8)
    gold = {r["prompt"]: r["answer"] for r in rows}
    order = [r["prompt"] for r in rows]

    def policy(q, k):  # even prompts: sample 1 right, others wrong; odd prompts: all wrong (all equal)
        i = order.index(q)
        return _boxed(gold[q]) if (i % 2 == 0 and k == 1) else _boxed(int(gold[q]) + 1 + k)

    cfg = PreferenceDataConfig(
        method="graded",
        policy_model="p",
        num_samples=3,
        output_dir=str(tmp_path / "g"),
        batch_size=3,
        mode_format=False,
    )  # ranked by score alone (the mode's form: below)
    card = generate_preferences(
        cfg, {"train": rows}, {"policy": Generator("pol", ScriptedEngine(tok, policy), tok, "think")}
    )
    c = card["counts"]["train"]
    assert (c["prompts"], c["kept"], c["all_equal"], c["unscored"]) == (8, 4, 4, 0)
    pairs = [json.loads(x) for x in (tmp_path / "g" / "train.jsonl").read_text().splitlines()]
    for p in pairs:
        q = p["prompt"][-1]["content"]
        assert order.index(q) % 2 == 0
        assert p["chosen"][0]["content"] == _boxed(gold[q]) and p["rejected"][0]["content"] != _boxed(gold[q])
        assert (p["chosen_score"], p["rejected_score"]) == (1.0, 0.0) and p["mean_score"] == pytest.approx(1 / 3)
    assert card["sampling"]["num_samples"] == 3 and card["sampling"]["temperature"] == 0.8


def test_graded_pairs_in_both_modes_keep_each_rows_mode_budget_and_measure_both_sides(tmp_path, tok):
    """policy_mode `row`: every prompt is asked in its own mode (the no_think one with the template's empty think
    block) under that mode's budget, its pair keeps its flag, and the card says how strong each side's source is
    per mode: the policy's pass@1 against best-of-n."""
    from data_gen.tasks import prompt_messages

    rows = _rows(8)
    for i, r in enumerate(rows):  # builtin:tasks' shape: the question in `prompt`, the flag in `prompt_messages`
        r["prompt_messages"] = prompt_messages(r, "think" if i % 2 == 0 else "no_think")
    rows[6]["prompt"] = rows[6].pop("prompt_messages")  # or a prompt that carries its own flag
    gold = {(r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"]): r["answer"] for r in rows}
    order = list(gold)

    def policy(q, k):  # think prompts: samples 0 and 1 right of 4; no_think prompts 1 and 3: sample 2 right only
        i = order.index(q)
        right = k in (0, 1) if i % 2 == 0 else (i in (1, 3) and k == 2)
        return _boxed(gold[q]) if right else _boxed(int(gold[q]) + 1 + k)

    class Budgeted(ScriptedEngine):
        def generate(self, prompts, params):
            self.budgets = getattr(self, "budgets", []) + [params.max_new_tokens] * len(prompts)
            return super().generate(prompts, params)

    engine = Budgeted(tok, policy)
    cfg = PreferenceDataConfig(
        method="graded",
        policy_model="p",
        policy_mode="row",
        num_samples=4,
        mode_format=False,
        max_new_tokens_by_mode={"think": 40, "no_think": 12},
        output_dir=str(tmp_path / "g"),
        batch_size=8,
    )
    card = generate_preferences(cfg, {"train": rows}, {"policy": Generator("pol", engine, tok, "row")})
    by_text = dict(zip(engine.seen, engine.budgets))
    for text, budget in by_text.items():
        assert (budget, text.endswith("<think>\n\n</think>\n")) == ((12, True) if "/no_think" in text else (40, False))
    pairs = [json.loads(x) for x in (tmp_path / "g" / "train.jsonl").read_text().splitlines()]
    assert sorted(order.index(p["prompt"][-1]["content"]) for p in pairs) == [0, 1, 2, 3, 4, 6]
    for p in pairs:
        i = order.index(p["prompt"][-1]["content"])
        assert p["mode"] == ("think" if i % 2 == 0 else "no_think")
        assert p["prompt"][0] == {"role": "system", "content": f"/{p['mode']}"}
    st = card["strength"]
    assert st["train/think"] == {"prompts": 4, "kept": 4, "policy_accuracy": 0.5, "best_of_n_accuracy": 1.0}
    assert st["train/no_think"] == {"prompts": 4, "kept": 2, "policy_accuracy": 0.125, "best_of_n_accuracy": 0.5}
    assert "| train/no_think | 4 | 2 | 0.125 | 0.500 |" in (tmp_path / "g" / "README.md").read_text()


def test_graded_pairs_of_two_wrong_answers_are_dropped_unless_verify_chosen_is_off(tmp_path, tok):
    """Every sample wrong, one in the asked mode's form and one not: the best (wrong, in form) would be chosen and an
    NLL term would train a wrong answer. verify_chosen (default) drops it (chosen_wrong); off keeps it."""
    from data_gen.tasks import prompt_messages

    rows = _rows(4)
    for r in rows:
        r["prompt_messages"] = prompt_messages(r, "no_think")
    gold = {r["prompt"]: r["answer"] for r in rows}
    order = [r["prompt"] for r in rows]

    def policy(q, k):  # prompts 0, 1: one right sample; prompts 2, 3: wrong in form vs wrong with a think block
        i = order.index(q)
        if i < 2:
            return _boxed(gold[q]) if k == 0 else _boxed(int(gold[q]) + 1)
        return _boxed(int(gold[q]) + 1) if k == 0 else "<think>\nhm\n</think>\n" + _boxed(int(gold[q]) + 2)

    kept = {}
    for verify in (True, False):
        out = tmp_path / str(verify)
        cfg = PreferenceDataConfig(
            method="graded",
            policy_model="p",
            policy_mode="row",
            num_samples=2,
            output_dir=str(out),
            batch_size=4,
            verify_chosen=verify,
        )
        card = generate_preferences(
            cfg, {"train": rows}, {"policy": Generator("pol", ScriptedEngine(tok, policy), tok, "row")}
        )
        pairs = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
        kept[verify] = sorted(order.index(p["prompt"][-1]["content"]) for p in pairs)
        assert card["counts"]["train"].get("chosen_wrong", 0) == (2 if verify else 0)
        if verify:
            assert all(p["chosen_score"] == 1.0 for p in pairs)
    assert kept == {True: [0, 1], False: [0, 1, 2, 3]}


def test_resume_after_interruption_duplicates_nothing(tmp_path, tok):
    rows = _rows(20)
    gold = {r["prompt"]: r["answer"] for r in rows}

    def gens(fail_after=None):
        return {
            "strong": Generator("s", ScriptedEngine(tok, lambda q, k: _boxed(gold[q]), fail_after), tok, "think"),
            "weak": Generator("w", ScriptedEngine(tok, lambda q, k: "no"), tok, "think"),
        }

    full = generate_preferences(_cfg(tmp_path / "a"), {"train": rows}, gens())
    with pytest.raises(KeyboardInterrupt):  # dies in the third batch
        generate_preferences(_cfg(tmp_path / "b"), {"train": rows}, gens(fail_after=2))
    work = tmp_path / "b" / "out" / ".work"
    assert len((work / "train.progress.jsonl").read_text().splitlines()) == 2
    # a torn batch: its pairs landed but its progress line did not -> dropped on resume and redone
    with open(work / "train.pairs.jsonl", "a") as f:
        f.write(json.dumps({"id": prefs.row_id(rows[9]), "prompt": "stale"}) + "\n")
    again = gens()
    card = generate_preferences(_cfg(tmp_path / "b"), {"train": rows}, again)
    assert again["strong"].engine.calls == 3  # only the 3 unfinished batches of 5
    a = (tmp_path / "a" / "out" / "train.jsonl").read_text().splitlines()
    b = (tmp_path / "b" / "out" / "train.jsonl").read_text().splitlines()
    assert a == b and len({json.loads(x)["id"] for x in b}) == 20
    assert card["counts"]["train"]["kept"] == full["counts"]["train"]["kept"] == 20
    assert card["counts"]["train"]["prompts"] == 20 and card["counts"]["train"]["batches_resumed"] == 2


def test_max_pairs_and_output_formats_load_back(tmp_path, tok):
    from align.data.loading import load_source

    rows = {"train": _rows(10, "train"), "test": _rows(6)}
    gold = {r["prompt"]: r["answer"] for split in rows.values() for r in split}
    for fmt in ("parquet", "disk"):
        gens = {
            "strong": Generator("s", ScriptedEngine(tok, lambda q, k: _boxed(gold[q])), tok, "think"),
            "weak": Generator("w", ScriptedEngine(tok, lambda q, k: "no"), tok, "think"),
        }
        cfg = _cfg(tmp_path / fmt, output_format=fmt, max_pairs=5, batch_size=4)
        card = generate_preferences(cfg, rows, gens)
        assert card["counts"]["train"]["kept"] == 5 and card["counts"]["train"]["over_max_pairs"] == 3
        assert gens["strong"].engine.calls == 2 + 2  # train stops after 2 batches; test needs 2
        train = load_source(str(tmp_path / fmt / "out"), split="train")
        test = load_source(str(tmp_path / fmt / "out"), split="test")
        assert (len(train), len(test)) == (5, 5)
        assert {"prompt", "chosen", "rejected", "id", "answer"} <= set(train.column_names)


def test_pairs_feed_the_preference_trainers(tmp_path, tok):
    from align.preference.data import prepare_preference_data

    rows = _rows(8)
    gold = {r["prompt"]: r["answer"] for r in rows}
    gens = {
        "strong": Generator("s", ScriptedEngine(tok, lambda q, k: _boxed(gold[q])), tok, "think"),
        "weak": Generator("w", ScriptedEngine(tok, lambda q, k: "no"), tok, "think"),
    }
    generate_preferences(_cfg(tmp_path), {"train": rows}, gens)
    from align.data.loading import load_source

    ds = load_source(str(tmp_path / "out"), split="train")
    assert len(prepare_preference_data(ds, "dpo")) == 8
    assert sorted(prepare_preference_data(ds, "kto")["label"]) == [False] * 8 + [True] * 8


def test_main_loads_prompts_and_builds_one_engine_per_model(tmp_path, tok, monkeypatch):
    built = []

    def fake_build(name, model, mode, cfg):
        built.append((model, mode))
        return Generator(model, ScriptedEngine(tok, lambda q, k: "x" if model == "weak" else "y"), tok, mode)

    monkeypatch.setattr(prefs, "build_generator", fake_build)
    script = ScriptArguments(dataset_name="builtin:tasks", dataset_args={"families": ["compare"], "num": 6, "seed": 1})
    cfg = _cfg(tmp_path, weak_mode="no_think", verify_chosen=False)
    card = prefs.main(script, cfg)
    assert built == [("strong", "think"), ("weak", "no_think")]
    assert card["counts"]["train"]["kept"] == 6 and card["source"] == "builtin:tasks"


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"strong_model": None}, "strong_weak needs strong_model and weak_model"),
        ({"method": "graded"}, "graded needs policy_model"),
        ({"method": "graded", "policy_model": "p", "num_samples": 1}, "num_samples must be >= 2"),
        ({"method": "graded", "policy_model": "p", "temperature": 0.0}, "set temperature > 0"),
        ({"strong_mode": "reason"}, "strong_mode must be one of"),
        ({"output_format": "csv"}, "output_format must be one of"),
        ({"method": "best"}, "method must be one of"),
    ],
)
def test_config_errors_name_the_field(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, **kw)


def test_real_tiny_models_through_the_rollout_engine(tmp_path, tok):
    """Two tiny random models through align.rollout's hf backend: every prompt ends kept or in one filter."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from align.rollout import get_engine

    torch.set_num_threads(1)
    gens = {}
    for name, seed in (("strong", 0), ("weak", 1)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=256,
        )
        model = LlamaForCausalLM(cfg).eval()
        gens[name] = Generator(name, get_engine(model, backend="hf", tokenizer=tok), tok, "no_think")
    card = generate_preferences(_cfg(tmp_path, max_new_tokens=6, verify_chosen=False), {"test": _rows(6)}, gens)
    c = card["counts"]["test"]
    assert c["prompts"] == 6 and c["kept"] + c["empty"] + c["identical"] == 6
    assert c["kept"] >= 1  # two different random models disagree somewhere


def test_tiny_preferences_recipe_parses():
    from align.cli import parse

    path = Path(__file__).resolve().parents[1] / "recipes" / "tiny/preferences.yaml"
    assert path.read_text().startswith("# python scripts/generate_preferences.py recipes/tiny/preferences.yaml")
    script, cfg = parse(ScriptArguments, PreferenceDataConfig, args=[str(path)])
    assert (cfg.method, cfg.strong_model, cfg.weak_model) == (
        "strong_weak",
        "outputs/tiny/sft_strong",
        "outputs/tiny/sft",
    )
    assert script.dataset_name == "builtin:tasks" and cfg.prompt_mode == "think" and cfg.temperature == 0.0


def test_a_chosen_answer_is_right_and_in_its_modes_form(tmp_path, tok):
    """A right answer with a think block under /no_think is never chosen: it loses to the same answer without one
    (a format pair), and a prompt whose only right answers are off-mode is dropped (chosen_off_mode)."""
    from data_gen.tasks import prompt_messages

    rows = _rows(3)
    for r in rows:
        r["prompt_messages"] = prompt_messages(r, "no_think")
    gold = {r["prompt"]: r["answer"] for r in rows}
    order = [r["prompt"] for r in rows]

    def policy(q, k):
        right, i = _boxed(gold[q]), order.index(q)
        think = "<think>\nlet me see\n</think>\n"
        table = [
            [think + right, right, _boxed(int(gold[q]) + 1)],  # right off-mode, right, wrong
            [think + right, think + right, _boxed(int(gold[q]) + 1)],  # right only off-mode
            [think + right, right, think + _boxed(int(gold[q]) + 1)],
        ]  # wrong off-mode is the worst
        return table[i][k]

    cfg = PreferenceDataConfig(
        method="graded",
        policy_model="p",
        policy_mode="row",
        num_samples=3,
        output_dir=str(tmp_path / "g"),
        batch_size=3,
    )
    card = generate_preferences(
        cfg, {"train": rows}, {"policy": Generator("pol", ScriptedEngine(tok, policy), tok, "row")}
    )
    pairs = {
        order.index(json.loads(x)["prompt"][-1]["content"]): json.loads(x)
        for x in (tmp_path / "g" / "train.jsonl").read_text().splitlines()
    }
    assert sorted(pairs) == [0, 2] and card["counts"]["train"]["chosen_off_mode"] == 1
    for i in (0, 2):
        assert pairs[i]["chosen"][0]["content"] == _boxed(gold[order[i]])  # right, no think block
    assert pairs[2]["rejected"][0]["content"].startswith("<think>")  # wrong and off-mode: the worst
