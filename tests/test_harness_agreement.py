r"""Agreement with the field's harness: lighteval 0.13.0 (what SmolLM3's evaluation used), on the same builtin items.

lighteval cannot be installed beside our pins: pip would downgrade latex2sympy2_extended to 1.0.6 (math-verify
0.9.0 pins 1.11.0), termcolor and fsspec, and add ~40 packages; installed with --no-deps (plus ~35 of them by hand)
its `lighteval.metrics.metrics` refuses to import on that same latex2sympy2_extended pin. So these tests transcribe
its published formulas (each function below names the file of the lighteval 0.13.0 wheel it comes from) and
compare our scorer with them; where lighteval itself imports (a side environment), its own classes are checked too.

- Log-likelihood of an option (`_lighteval_loglik`): one request at a time, tokenized as
  `tok_encode_pair(pairwise=True)` does, log-softmax at the continuation positions
  (`TransformersModel._loglikelihood_tokens`).
- HellaSwag / our tasks, cloze: `LoglikelihoodAcc(LogProbCharNorm())` (acc_norm: log-likelihood per character of
  the option text " " + option). Letter (MCF): `LoglikelihoodAcc()` over " A", " B", ...
- TruthfulQA MC1: `TruthfulqaMCMetrics.mc1`: argmax of the raw log-likelihoods, the true answer listed first (we
  shuffle the options, so the recorded order puts it back first).
- GSM8K: `Metrics.expr_gold_metric` (math-verify extraction of the gold and of the prediction, first match
  fallback, 5 decimal places), run through math-verify, where lighteval's extraction code now lives (checked equal
  to lighteval's own class on 22 completions in the side environment).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_evaluate import model, tok  # noqa: F401  (fixtures: a tiny SmolLM3 and its tokenizer)

from align.eval.multiple_choice import LETTERS, letter_prompt
from align.eval.suite import MC_NORM, EvalConfig, mc_items, score_mc
from align.eval.verification import correct

torch.set_num_threads(2)

# ------------------------------------------------------------------------------ lighteval 0.13.0's formulas


def _lighteval_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """models/abstract_model.py `tok_encode_pair(pairwise=True)` with `add_special_tokens=True` (its default)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    context_enc = tokenizer.encode(context, add_special_tokens=True)
    continuation_enc = tokenizer.encode(continuation, add_special_tokens=False)
    if len(context_enc) > 0 and context_enc[-1] == tokenizer.eos_token_id:
        context_enc = context_enc[:-1]
    return context_enc, continuation_enc


@torch.no_grad()
def _lighteval_loglik(lm, tokenizer, context: str, continuation: str) -> float:
    """models/transformers/transformers_model.py `_loglikelihood_tokens`, one unpadded request."""
    ctx, cont = _lighteval_pair(tokenizer, context, continuation)
    ids = torch.tensor([ctx + cont])
    logits = torch.log_softmax(lm(ids).logits.float(), dim=-1)[0]
    n = len(ids[0])
    return logits[n - len(cont) - 1 : n - 1].gather(1, torch.tensor(cont)[:, None]).sum().item()


def _loglikelihood_acc(logprobs: list[float], gold: int, choices: list[str], char_norm: bool) -> int:
    """metrics/metrics_sample.py `LoglikelihoodAcc.compute` + metrics/normalizations.py `normalize_log_probs`
    (`LogProbCharNorm(ignore_first_space=False)`: divide by len(choice))."""
    normalized = [lp / len(c) for lp, c in zip(logprobs, choices)] if char_norm else logprobs
    return int(np.argmax(normalized) in [gold])


def _truthfulqa_mc1(lls: list[float]) -> bool:
    """metrics/harness_compatibility/truthful_qa.py `TruthfulqaMCMetrics.mc1`: the gold is first."""
    return np.argmax(lls) == 0


def _extractive_match(gold: str, prediction: str) -> float:
    """metrics/metrics.py `expr_gold_metric`: MultilingualExtractiveMatchMetric(gold=(ExprExtractionConfig(),),
    pred=(ExprExtractionConfig(), LatexExtractionConfig(boxed_match_priority=0)), fallback_mode="first_match",
    precision=5), aggregation max over one prediction."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    golds = parse(gold, extraction_config=[ExprExtractionConfig()], fallback_mode="first_match") or [gold]
    preds = parse(
        prediction,
        extraction_config=[ExprExtractionConfig(), LatexExtractionConfig(boxed_match_priority=0)],
        fallback_mode="first_match",
        extraction_mode="any_match",
    )
    return float(verify(golds, preds, float_rounding=5))


def _real_lighteval():
    """lighteval's own metric classes where it is installed (a side environment), else None."""
    try:
        from lighteval.metrics.harness_compatibility.truthful_qa import TruthfulqaMCMetrics
        from lighteval.metrics.metrics_sample import LoglikelihoodAcc
        from lighteval.metrics.normalizations import LogProbCharNorm
        from lighteval.models.model_output import ModelResponse
        from lighteval.tasks.requests import Doc
    except ImportError:
        return None
    return LoglikelihoodAcc, LogProbCharNorm, TruthfulqaMCMetrics, ModelResponse, Doc


# ------------------------------------------------------------------------------------------------ the check


def _agree_on_mc(lm, tokenizer, name: str, num: int) -> dict:
    """Our cf/mcf accuracy on `num` shuffled builtin items against lighteval's formulas on the same items and model;
    asserts agreement item by item and returns both accuracies."""
    items = mc_items(name, num, EvalConfig(model_name_or_path="m", seed=0))
    ours = score_mc(lm, tokenizer, items, MC_NORM[name], batch_size=8)
    real = _real_lighteval()
    cf_ref, mcf_ref = [], []
    for it, pick in zip(items, ours["picks"]):
        conts = [" " + c.strip() for c in it["choices"]]
        lls = [_lighteval_loglik(lm, tokenizer, it["context"], c) for c in conts]
        letter_conts = [f" {L}" for L in LETTERS[: len(conts)]]
        letters = [
            _lighteval_loglik(lm, tokenizer, letter_prompt(it["context"], it["choices"]), c) for c in letter_conts
        ]
        assert pick["cloze_logprobs"] == pytest.approx(lls, abs=2e-4)
        assert pick["letter_logprobs"] == pytest.approx(letters, abs=2e-4)
        if MC_NORM[name] is None:  # TruthfulQA MC1: put the options back in the source order, true answer first
            source = [0.0] * len(lls)
            for position, src in enumerate(it["order"]):
                source[src] = lls[position]
            assert it["order"][it["label"]] == 0
            cf_ref.append(int(_truthfulqa_mc1(source)))
        else:
            cf_ref.append(_loglikelihood_acc(lls, it["label"], conts, char_norm=True))
        mcf_ref.append(_loglikelihood_acc(letters, it["label"], letter_conts, char_norm=False))
        if real is not None:  # the same numbers through lighteval's own classes
            acc, char_norm, mc, response, doc = real
            if MC_NORM[name] is None:
                assert bool(mc().mc1(source)) == bool(cf_ref[-1])
            else:
                d = doc(query=it["context"], choices=conts, gold_index=it["label"])
                assert (
                    acc(char_norm()).compute(d, response(logprobs=lls, output_tokens=[[0]] * len(lls))) == cf_ref[-1]
                )
            d = doc(query=letter_prompt(it["context"], it["choices"]), choices=letter_conts, gold_index=it["label"])
            assert acc(None).compute(d, response(logprobs=letters, output_tokens=[[0]] * len(letters))) == mcf_ref[-1]
        assert int(pick["cf"] == pick["label"]) == cf_ref[-1], (name, it, pick)
        assert int(pick["mcf"] == pick["label"]) == mcf_ref[-1], (name, it, pick)
    assert ours["cf"]["cf"] == pytest.approx(sum(cf_ref) / len(items))
    assert ours["mcf"]["mcf"] == pytest.approx(sum(mcf_ref) / len(items))
    return {"cf": ours["cf"]["cf"], "mcf": ours["mcf"]["mcf"], "chance": ours["chance"]}


@pytest.mark.parametrize("name", ["hellaswag", "truthfulqa", "tasks"])
def test_multiple_choice_agrees_with_lighteval_on_a_tiny_model(model, tok, name):  # noqa: F811
    _agree_on_mc(model, tok, name, 8)


# GSM8K completions: where the final answer is stated (boxed, or "The answer is X"), lighteval and our verifier agree;
# lighteval also takes a bare number anywhere in the text and boxed arithmetic, which our one definition of correct
# refuses on purpose (rewards/answer.py: echoing the question's numbers earns nothing). Ours never accepts what
# lighteval rejects.
GSM8K_CASES = [
    ("18", "The answer is \\boxed{18}.", 1, 1),
    ("18", "The answer is 18.", 1, 1),
    ("40", "The final answer is 40 dollars.", 1, 1),
    ("0.5", "\\boxed{1/2}", 1, 1),
    ("1430", "So the total is \\boxed{1,430}.", 1, 1),
    ("40", "\\boxed{40.0}", 1, 1),
    ("18", "I think \\boxed{17}", 0, 0),
    ("5", "The answer is \\boxed{5} or \\boxed{6}", 0, 0),
    ("36", "first 12 then 36 then 40", 0, 0),
    ("18", "so she started with 18 vacuum cleaners", 0, 1),  # a number in prose: lighteval's fallback takes it
    ("18", "\\boxed{3 + 15}", 0, 1),  # arithmetic, not an answer
]


@pytest.mark.parametrize("gold, completion, ours, theirs", GSM8K_CASES)
def test_gsm8k_exact_match_against_lightevals_math_verify_metric(gold, completion, ours, theirs):
    assert _extractive_match(gold, completion) == theirs
    try:  # lighteval's own metric, where it imports (its latex2sympy2_extended pin relaxed in a side environment)
        from lighteval.metrics.metrics import Metrics
        from lighteval.models.model_output import ModelResponse
        from lighteval.tasks.requests import Doc
    except ImportError:
        pass
    else:
        metric = getattr(Metrics.expr_gold_metric, "value", Metrics.expr_gold_metric).sample_level_fn
        assert metric.compute(Doc(query="q", choices=[gold], gold_index=0), ModelResponse(text=[completion])) == theirs
    assert correct([completion], [{"answer": gold, "reward": "math_reward"}]) == [bool(ours)]


@pytest.mark.slow
def test_builtin_smollm2_agrees_with_lighteval_on_the_same_items():
    """SmolLM2-135M-Instruct (builtin): HellaSwag and TruthfulQA cloze/letter picks item by item, and GSM8K greedy
    answers scored by both definitions."""
    from align.eval.generation import model_generate
    from align.eval.generative import run_generative
    from align.eval.suite import gen_rows
    from align.modeling.loading import load_model, load_tokenizer

    smol, tokenizer = (
        load_model("builtin:smollm2-135m-instruct", dtype="float32"),
        load_tokenizer("builtin:smollm2-135m-instruct"),
    )
    for name in ("hellaswag", "truthfulqa"):
        res = _agree_on_mc(smol, tokenizer, name, 12)
        assert 0.0 <= res["mcf"] <= 1.0
    rows = gen_rows("gsm8k", 4, EvalConfig(model_name_or_path="m"))
    stats, samples = run_generative(model_generate(smol, tokenizer), tokenizer, rows, "no_think", 96)
    theirs = [_extractive_match(r["answer"], s["completion"]) for r, s in zip(rows, samples)]
    assert all(t >= float(s["correct"]) for s, t in zip(samples, theirs))  # ours => lighteval's
    assert stats["acc"] == pytest.approx(sum(theirs) / len(rows)), (samples, theirs)


FAKE_LIGHTEVAL = """#!{python}
import json, os, sys
out = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(os.path.join(out, "results", "m"), exist_ok=True)
json.dump({{"argv": sys.argv[1:], "rank": os.environ.get("RANK")}}, open(os.path.join(out, "argv.json"), "w"))
results = {{"gsm8k|5": {{"extractive_match": 0.25, "extractive_match_stderr": 0.1}},
           "all": {{"extractive_match": 0.25}}}}
json.dump({{"results": results}}, open(os.path.join(out, "results", "m", "results_2026.json"), "w"))
"""


def test_checkpoint_evaluation_hands_hub_benchmarks_to_lighteval(model, tok, tmp_path, monkeypatch):  # noqa: F811
    import json
    import sys

    from align.eval.suite import evaluate

    fake = tmp_path / "lighteval"
    fake.write_text(FAKE_LIGHTEVAL.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("RANK", "0")  # a launcher's variable: lighteval must not inherit it
    (tmp_path / "config.json").write_text("{}")  # the checkpoint directory handed over
    cfg = EvalConfig(
        model_name_or_path=str(tmp_path),
        output_dir=str(tmp_path / "ev"),
        suites=["loss"],
        loss_num_texts=2,
        lighteval_tasks=["gsm8k|5"],
        lighteval_bin=str(fake),
        lighteval_backend="vllm",
        lighteval_model_args="dtype=bfloat16",
    )
    metrics = evaluate(cfg, model=model, tokenizer=tok)["metrics"]
    assert metrics["lighteval/gsm8k|5/extractive_match"] == 0.25 and "loss/tasks" in metrics
    assert metrics["lighteval/gsm8k|5/extractive_match_stderr"] == 0.1 and not any("/all/" in k for k in metrics)
    seen = json.loads((tmp_path / "ev" / "lighteval" / "argv.json").read_text())
    assert seen["argv"] == [
        "vllm",
        f"model_name={tmp_path},dtype=bfloat16",
        "gsm8k|5",
        "--output-dir",
        str(tmp_path / "ev" / "lighteval"),
    ]
    assert seen["rank"] is None
    with pytest.raises(ValueError, match="lighteval_bin='no-such-lighteval' is not an executable"):
        evaluate(
            EvalConfig(
                model_name_or_path="m",
                output_dir=str(tmp_path / "x"),
                suites=["loss"],
                loss_num_texts=1,
                lighteval_tasks=["gsm8k|5"],
                lighteval_bin="no-such-lighteval",
            ),
            model=model,
            tokenizer=tok,
        )
