"""align/eval/suite.py: log-likelihood scoring, CF/MCF picks, held-out loss, generative metrics, results file.

A tiny random SmolLM3 and a tokenizer trained in the fixture (no hub); generation goes through a scripted
engine whose answers we choose, so accuracy / format rate / lengths are checked against hand counts.
"""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from align.eval.generative import build_prompt, is_formatted, run_generative
from align.eval.multiple_choice import cloze_pick, letter_prompt, pair_ids, sequence_logprobs
from align.eval.suite import EvalConfig, evaluate, heldout_loss, score_mc, set_spec, task_mc_items

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def tok():
    from data_gen.tasks import make_tasks, to_pretrain_text
    from pretrain.tokenizer import train_tokenizer

    texts = [to_pretrain_text(r) for r in make_tasks(num=300)]
    texts += ["The cat sat on the mat. A dog ran in the park. Answer: A B C D"] * 20
    return train_tokenizer(texts, vocab_size=420)


@pytest.fixture(scope="module")
def model(tok):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(0)
    cfg = SmolLM3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
    )
    m = SmolLM3ForCausalLM(cfg)
    with torch.no_grad():  # a sharper random model: log-likelihoods then differ clearly between choices
        m.model.embed_tokens.weight.mul_(20)
    return m.eval()


def _direct_logprob(model, tok, context: str, continuation: str) -> float:
    """log p(continuation | context) from one unpadded forward pass, token by token, the context tokenized with the
    tokenizer's own special tokens and the continuation on its own (lighteval's loglikelihood requests)."""
    ctx = tok(context, add_special_tokens=True)["input_ids"]
    cont = tok(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([[*ctx, *cont]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return sum(logp[len(ctx) + j - 1, cont[j]].item() for j in range(len(cont)))


def test_sequence_logprobs_match_direct_computation_despite_padding(model, tok):
    pairs = [
        ("Question: What is 2 + 3?", " The answer is 5."),
        ("A", " cat sat on the mat and then ran away"),
        ("B ", "dog"),
    ]
    seqs = [(c + x, len(x)) for c, x in (pair_ids(tok, ctx, cont) for ctx, cont in pairs)]
    got = sequence_logprobs(model, seqs, batch_size=3)  # one padded batch of different lengths
    for (ctx, cont), (s, n) in zip(pairs, got):
        if ctx.endswith(" "):  # trailing context whitespace moves to the continuation, as lighteval does
            ctx, cont = ctx.rstrip(), " " + cont
        assert n == len(tok(cont, add_special_tokens=False)["input_ids"])
        assert s == pytest.approx(_direct_logprob(model, tok, ctx, cont), abs=1e-4)


def test_heldout_loss_equals_the_models_own_loss(model, tok):
    text = "Question: What is 4 + 4?\nAnswer: 4 + 4 = 8. The answer is \\boxed{8}."
    res = heldout_loss(model, tok, [text], max_tokens=1000)
    ids = [tok.convert_tokens_to_ids("<|endoftext|>")] + tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert res["tokens"] == len(ids) - 1
    assert res["loss"] == pytest.approx(ref, abs=1e-4)
    assert res["ppl"] == pytest.approx(math.exp(ref), rel=1e-4)


@pytest.mark.parametrize("norm", ["char", None])
def test_cf_picks_highest_loglik_per_character_or_raw_and_mcf_the_best_letter(model, tok, norm):
    items = [
        {"context": "The cat sat on the", "choices": ["mat.", "dog ran in the park.", "cat", "A"], "label": 0},
        {"context": "Question: What is 2 + 3?", "choices": ["5", "6", "The answer is 7.", "park"], "label": 2},
    ]
    res = score_mc(model, tok, items, norm, batch_size=5)
    for it, pick in zip(items, res["picks"]):
        raw = [_direct_logprob(model, tok, it["context"], " " + c) for c in it["choices"]]
        norm_by = [len(" " + c) if norm == "char" else 1 for c in it["choices"]]
        assert pick["cf"] == max(range(4), key=lambda i: raw[i] / norm_by[i])
        letters = [_direct_logprob(model, tok, letter_prompt(it["context"], it["choices"]), f" {L}") for L in "ABCD"]
        assert pick["mcf"] == max(range(4), key=letters.__getitem__)
        assert pick["letter_logprobs"] == pytest.approx(letters, abs=1e-4)
    assert res["cf"]["cf"] == pytest.approx(sum(p["cf"] == p["label"] for p in res["picks"]) / 2)
    assert res["mcf"]["mcf"] == pytest.approx(sum(p["mcf"] == p["label"] for p in res["picks"]) / 2)
    assert res["mcf"]["num"] == 2 and res["mcf"]["ci_low"] <= res["mcf"]["mcf"] <= res["mcf"]["ci_high"]
    assert res["chance"] == pytest.approx(0.25)


def test_cloze_pick_normalises_by_length_or_not():
    # raw log-lik prefers the short choice; per character the long one is likelier
    assert cloze_pick([-3.0, -8.0], ["ab", "abcdefghij"]) == 1
    assert cloze_pick([-3.0, -8.0], ["abcdefghij", "ab"]) == 0
    assert cloze_pick([-3.0, -8.0], ["ab", "abcdefghij"], norm=None) == 0


def test_task_mc_items_hold_the_gold_and_distinct_near_misses():
    from data_gen.tasks import make_tasks

    rows = make_tasks(num=40, split="test", seed=1)
    items = task_mc_items(rows, seed=1)
    assert len(items) == len(rows)
    for row, it in zip(rows, items):
        assert it["choices"][it["label"]] == f"\\boxed{{{row['answer']}}}."
        assert len(set(it["choices"])) == len(it["choices"]) == 4
        assert row["prompt"] in it["context"]
    assert task_mc_items(rows, seed=1) == items  # deterministic
    assert len({it["label"] for it in items}) > 1  # the gold is not always first
    for it in items:  # the recorded order leads back to the source options: the gold first
        assert it["order"][it["label"]] == 0


@pytest.mark.parametrize(
    "text, mode, ok",
    [
        ("<think>\n2+2=4\n</think>\nThe answer is \\boxed{4}.", "think", True),
        ("The answer is \\boxed{4}.", "think", False),
        ("<think>\n\n</think>\nThe answer is \\boxed{4}.", "think", False),
        ("The answer is \\boxed{4}.", "no_think", True),
        ("<think>\nhmm\n</think>\nThe answer is \\boxed{4}.", "no_think", False),
        ("The answer is 4.", "no_think", False),
        ("2 + 2 = 4. The answer is \\boxed{4}.", "plain", True),
        ("4", "plain", False),
    ],
)
def test_format_rate_cases(text, mode, ok):
    assert is_formatted(text, mode) is ok


class ScriptedEngine:
    """Answers each prompt with `reply(prompt_text)`; a reply ending in '...' counts as cut at max tokens."""

    def __init__(self, tok, reply):
        self.tok, self.reply, self.calls = tok, reply, []

    def generate(self, prompts, params):
        self.calls.append(params)
        out = []
        for ids in prompts:
            text = self.reply(self.tok.decode(ids))
            done = not text.endswith("...")
            comp = self.tok(text + ("<|im_end|>" if done else ""), add_special_tokens=False)["input_ids"]
            out.append(
                [SimpleNamespace(prompt_ids=ids, completion_ids=comp, finish_reason="stop" if done else "length")]
            )
        return out

    def close(self):
        pass


def test_generative_accuracy_format_and_lengths_are_hand_checkable(tok):
    from data_gen.tasks import make_tasks

    rows = make_tasks(["arithmetic"], num=4, split="test", seed=3)
    answers = {r["prompt"]: r["answer"] for r in rows}
    right = set(list(answers)[:3])  # 3 of 4 right

    def reply(prompt_text):
        q = next(p for p in answers if p in prompt_text)
        if q == list(answers)[3]:
            return "<think>\nlong reasoning" + " and more" * 3 + "..."  # cut: wrong and unformatted
        ans = answers[q] if q in right else "999999"
        return f"<think>\nwork\n</think>\nThe answer is \\boxed{{{ans}}}."

    engine = ScriptedEngine(tok, reply)
    stats, samples = run_generative(engine, tok, rows, "think", max_new_tokens=64)
    assert stats["acc"] == pytest.approx(3 / 4)
    assert stats["format"] == pytest.approx(3 / 4)
    assert stats["truncated"] == pytest.approx(1 / 4)
    assert stats["num"] == 4
    assert engine.calls[0].temperature == 0.0 and engine.calls[0].max_new_tokens == 64
    assert tok.convert_tokens_to_ids("<|im_end|>") in engine.calls[0].stop_token_ids
    lens = [
        len(tok(s["completion"] + ("<|im_end|>" if i < 3 else ""), add_special_tokens=False)["input_ids"])
        for i, s in enumerate(samples)
    ]
    assert stats["len_mean"] == pytest.approx(sum(lens) / 4)
    assert "<|im_end|>" not in samples[0]["completion"]


def test_prompts_follow_the_reasoning_mode(tok):
    think = build_prompt(tok, "What is 2 + 2?", "think")
    no_think = build_prompt(tok, "What is 2 + 2?", "no_think")
    assert "/think" in think and think.rstrip().endswith("assistant")
    assert no_think.rstrip().endswith("</think>")  # SmolLM3's empty think block opens a no_think answer
    assert build_prompt(tok, "What is 2 + 2?", "plain") == "Question: What is 2 + 2?\nAnswer:"


def test_evaluate_writes_results_and_vibes(model, tok, tmp_path):
    def reply(prompt_text):
        return "The answer is \\boxed{4}."

    cfg = EvalConfig(
        model_name_or_path="unused",
        output_dir=str(tmp_path / "ev"),
        stage="sft",
        loss_num_texts=4,
        mc_sets=["tasks:4", "hellaswag:2", "truthfulqa:2"],
        gen_sets=["tasks:4", "gsm8k:2"],
        modes=["no_think", "plain"],
        max_new_tokens=16,
        vibe_max_new_tokens=8,
    )
    res = evaluate(cfg, model=model, tokenizer=tok, engine=ScriptedEngine(tok, reply))
    saved = json.loads((tmp_path / "ev" / "eval_results.json").read_text())
    assert saved["metrics"] == pytest.approx(res["metrics"])
    m = res["metrics"]
    for key in (
        "loss/tasks",
        "ppl/tasks",
        "cf/tasks",
        "mcf/hellaswag",
        "cf/truthfulqa",
        "acc/tasks/no_think",
        "format/gsm8k/plain",
        "len_mean/tasks/no_think",
        "truncated/gsm8k/no_think",
    ):
        assert key in m, key
    assert m["format/tasks/no_think"] == 1.0 and m["ppl/tasks"] == pytest.approx(math.exp(m["loss/tasks"]))
    vibes = (tmp_path / "ev" / "vibes.md").read_text()
    assert "Name a fruit." in vibes and "## mode: no_think" in vibes and "\\boxed{4}" in vibes
    assert saved["stage"] == "sft"


def test_chat_loss_scores_the_answer_after_its_prompt_and_the_report_pairs_it(model, tok, tmp_path):
    """loss/chat: each held-out conversation's assistant answer scored after its prompt (the model's own template),
    one mean per conversation, equal to the model's loss on those tokens; per-item losses are recorded, so the
    report compares two stages on the same conversations (mean difference with its interval)."""
    from align.data.chat import setup_chat_format
    from align.eval.compare import paired_loss
    from align.eval.suite import chat_loss

    setup_chat_format(tok)
    convs = [
        [
            {"role": "user", "content": f"What is {i} + {i}?"},
            {"role": "assistant", "content": f"It is {2 * i}, since {i} and {i} make {2 * i}."},
        ]
        for i in range(6)
    ]
    items = chat_loss(model, tok, convs)
    prompt = tok.apply_chat_template(convs[0][:-1], add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(convs[0], tokenize=False)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(full[len(prompt) :].rstrip("\n"), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + a_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    ref = -sum(logp[len(p_ids) + j - 1, a_ids[j]].item() for j in range(len(a_ids))) / len(a_ids)
    assert len(items) == 6 and items[0] == pytest.approx(ref, abs=1e-4)
    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in convs))
    cfg = EvalConfig(
        model_name_or_path="unused",
        output_dir=str(tmp_path / "ev"),
        suites=["loss"],
        loss_num_texts=2,
        chat_loss_data=str(data),
        chat_loss_num=5,
    )
    res = evaluate(cfg, model=model, tokenizer=tok)
    assert res["metrics"]["loss/chat"] == pytest.approx(sum(items[:5]) / 5, abs=1e-5)
    assert res["stats"]["loss/chat"]["num"] == 5 and res["details"]["loss/chat"]["items"] == pytest.approx(items[:5])
    before = {"eval": {"results": str(tmp_path / "ev" / "eval_results.json")}, "metrics": res["metrics"]}
    shifted = json.loads((tmp_path / "ev" / "eval_results.json").read_text())
    shifted["details"]["loss/chat"]["items"] = [x + 0.5 + 0.01 * i for i, x in enumerate(items[:5])]
    (tmp_path / "after.json").write_text(json.dumps(shifted))
    after = {"eval": {"results": str(tmp_path / "after.json")}, "metrics": res["metrics"]}
    worse = paired_loss(before, after)
    assert worse["word"] == "**worse**" and worse["difference"] == pytest.approx(0.52)
    assert paired_loss(before, before)["word"] == "within noise"


def test_a_vllm_eval_engine_holds_the_prompt_and_the_whole_generation_budget():
    """SmolLM3's eval asks 4,096 new tokens: vLLM's default context (min(model, 4096)) would cut every long answer at
    4,096 minus its prompt and count it truncated; the engine gets room for both (never past the model's context)."""
    from types import SimpleNamespace

    from align.eval.suite import PROMPT_ROOM, engine_knobs

    def cfg(**kw):
        return EvalConfig(model_name_or_path="m", rollout_backend="vllm", max_new_tokens=4096, **kw)

    assert engine_knobs(cfg(), "m", SimpleNamespace(max_position_embeddings=65536)) == {
        "max_model_len": 4096 + PROMPT_ROOM
    }
    assert engine_knobs(cfg(), "m", SimpleNamespace(max_position_embeddings=2048)) == {"max_model_len": 2048}
    assert engine_knobs(cfg(rollout_kwargs={"max_model_len": 9000}), "m", None) == {"max_model_len": 9000}
    hf = EvalConfig(model_name_or_path="m", rollout_backend="hf", max_new_tokens=4096)
    assert engine_knobs(hf, "m", None) == {}


def test_the_evaluated_model_goes_to_this_ranks_gpu_when_there_is_one(model, tok, monkeypatch, tmp_path):
    """Per-stage evaluation loaded the model without a device: on a GPU machine the loss/MC suites ran on the CPU
    (and flash-attn's kernel failed on CPU tensors). With CUDA present the model goes to cuda:LOCAL_RANK."""
    import align.eval.suite as ev

    moved = []

    class Loaded(torch.nn.Module):
        def to(self, device):
            moved.append(device)
            return model

    monkeypatch.setattr(ev, "load_model", lambda *a, **k: Loaded())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert ev.eval_device() == torch.device("cuda", 3)
    monkeypatch.setattr(ev, "eval_device", lambda: torch.device("cpu"))  # this machine has no GPU to move to
    cfg = EvalConfig(model_name_or_path="unused", output_dir=str(tmp_path / "ev"), suites=["loss"], loss_num_texts=2)
    ev.evaluate(cfg, tokenizer=tok)
    assert moved == [torch.device("cpu")]


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="model_name_or_path"):
        EvalConfig()
    with pytest.raises(ValueError, match="suites: unknown"):
        EvalConfig(model_name_or_path="m", suites=["los"])
    with pytest.raises(ValueError, match="gen_sets: bad entry 'math:3'"):
        EvalConfig(model_name_or_path="m", gen_sets=["math:3"])
    assert set_spec("tasks:7", ("tasks",), "x") == ("tasks", 7)


def test_real_engine_answers_are_the_models_greedy_answers(model, tok):
    from align.eval.generative import decode_completion, stop_ids
    from align.rollout import get_engine
    from data_gen.tasks import make_tasks

    rows = make_tasks(["arithmetic"], num=2, split="test", seed=5)
    engine = get_engine(model, backend="hf", tokenizer=tok)
    try:
        stats, samples = run_generative(engine, tok, rows, "no_think", max_new_tokens=8)
    finally:
        engine.close()
    for row, sample in zip(rows, samples):
        ids = tok(build_prompt(tok, row["prompt"], "no_think"), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=stop_ids(tok),
                pad_token_id=tok.pad_token_id,
            )
        assert sample["completion"] == decode_completion(tok, out[0, len(ids) :].tolist(), "no_think")
    assert 0 < stats["len_mean"] <= 8


def test_compare_pairs_two_evaluations_on_their_items(model, tok, tmp_path, capsys):
    """scripts/compare.py: two models evaluated alike are judged item by item. The second answers 6 more of the same
    12 task prompts right and writes one no_think answer unboxed: gained / lost / p are the McNemar counts of those
    items; results on other prompts (another row count) are refused, not compared."""
    import importlib.util

    from align.eval.compare import compare
    from align.eval.suite import gen_rows

    cfg = EvalConfig(
        model_name_or_path="unused",
        suites=["generative"],
        gen_sets=["tasks:12"],
        modes=["think", "no_think"],
        max_new_tokens=32,
    )
    answers = {r["prompt"]: r["answer"] for r in gen_rows("tasks", 12, cfg)}
    order = list(answers)

    def run(name, num_right, unboxed=()):
        def reply(text):
            i = order.index(next(p for p in order if p in text))
            ans = answers[order[i]] if i < num_right else "no idea"
            think = "" if "/no_think" in text else "<think>\nwork\n</think>\n"  # the prompt's mode flag
            return (
                f"{think}The answer is {ans}."
                if i in unboxed and not think
                else f"{think}The answer is \\boxed{{{ans}}}."
            )

        out = tmp_path / name
        evaluate(
            EvalConfig(**{**cfg.__dict__, "output_dir": str(out)}),
            model=model,
            tokenizer=tok,
            engine=ScriptedEngine(tok, reply),
        )
        return out

    before, after = run("a", 3), run("b", 9, unboxed=(11,))  # prompt 11: wrong in both, unboxed in the second
    rows = {r["metric"]: r for r in compare(before, after)["rows"]}
    for mode in ("think", "no_think"):
        acc = rows[f"acc/tasks/{mode}"]
        assert (acc["num"], acc["before"], acc["after"]) == (12, 3 / 12, 9 / 12)
        assert (acc["gained"], acc["lost"], acc["p_value"], acc["word"]) == (6, 0, 0.03125, "better")
    fmt = rows["format/tasks/no_think"]
    assert (fmt["before"], fmt["gained"], fmt["lost"], fmt["word"]) == (1.0, 0, 1, "within noise")
    assert rows["format/tasks/think"]["after"] == 1.0

    spec = importlib.util.spec_from_file_location(
        "compare_script", Path(__file__).parents[1] / "scripts" / "compare.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    md = script.main([str(before), str(after / "eval_results.json"), "--out", str(tmp_path / "cmp.md")])
    assert "| acc/tasks/think | 12 | 25.0% | 75.0% | 6 | 0 | 0.031 | **better** |" in md
    assert (tmp_path / "cmp.md").read_text() == md

    # --first 4: prompts 0-2 right in both, prompt 3 gained (the next 5 gains are outside the first 4)
    head = {r["metric"]: r for r in compare(before, after, first=4)["rows"]}["acc/tasks/think"]
    assert (head["num"], head["before"], head["after"], head["gained"], head["lost"]) == (4, 3 / 4, 1.0, 1, 0)
    assert head["word"] == "within noise"
    md = script.main([str(before), str(after), "--first", "4"])
    assert "Paired on the first 4 items of each set" in md and "| acc/tasks/think | 4 | 75.0% | 100.0% | 1 | 0 |" in md
    with pytest.raises(ValueError, match="positive"):
        compare(before, after, first=0)

    other = tmp_path / "c"
    evaluate(
        EvalConfig(**{**cfg.__dict__, "gen_sets": ["tasks:8"], "output_dir": str(other)}),
        model=model,
        tokenizer=tok,
        engine=ScriptedEngine(tok, lambda text: "\\boxed{1}"),
    )
    with pytest.raises(ValueError, match="different items"):
        compare(before, other)
    with pytest.raises(SystemExit, match="no eval results"):
        script.main([str(before), str(tmp_path / "missing")])
