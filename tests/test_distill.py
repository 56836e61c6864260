"""align/distill/trainer.py: on-policy distillation (same tokenizer) and GOLD/ULD (two tokenizers) learn the teacher;
the teacher sees its own chat template; a bad teacher tokenizer and mismatched vocabularies are clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from align.config import ModelConfig, ScriptArguments
from align.distill import (
    LOSSES,
    DistillConfig,
    EngineGeneration,
    FewShotPool,
    main,
    resolve_tokenizer_mode,
    teacher_hints,
    teacher_messages,
    teacher_prompt_map,
)
from data_gen.tasks import make_tasks, to_messages

FAMILIES = ["arithmetic", "compare"]
# A SmolLM2-style ChatML template: default system prompt, no think modes, no generation markers.
TEACHER_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a teacher.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    """Student + same-tokenizer teacher (our template), and a cross teacher with another vocabulary and template."""
    from pretrain.tokenizer import train_tokenizer

    torch.set_num_threads(1)  # 2 threads on a shared 2-core machine spin-wait: 1 is faster under load
    root = tmp_path_factory.mktemp("distill")
    texts = [m["content"] for r in make_tasks(FAMILIES, num=64, seed=0) for m in to_messages(r, "no_think")]
    ours = train_tokenizer(texts * 4, vocab_size=400)
    other = train_tokenizer(texts[::2] * 4, vocab_size=300)
    other.chat_template = TEACHER_TEMPLATE
    tiny_model(root / "student", ours, seed=0)
    tiny_model(root / "teacher", ours, seed=1, hidden_size=48)
    tiny_model(root / "cross_teacher", other, seed=2, hidden_size=48)
    (root / "no_tokenizer").mkdir()
    (root / "no_tokenizer" / "config.json").write_text((root / "teacher" / "config.json").read_text())
    return {
        "root": root,
        "ours": ours,
        "other": other,
        **{k: str(root / k) for k in ("student", "teacher", "cross_teacher", "no_tokenizer")},
    }


def _configs(tiny, out, teacher, **kw):
    script = ScriptArguments(
        dataset_name="builtin:tasks",
        eval_num_prompts=6,
        dataset_args={"families": FAMILIES, "num": 32, "mode": "no_think"},
    )
    base = dict(
        output_dir=str(out),
        teacher_model_name_or_path=teacher,
        max_steps=5,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        temperature=1.0,
        max_completion_length=12,
        max_length=128,
        distill_eval_max_new_tokens=12,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=False,
        rollout_backend="hf",
    )
    base.update(kw)
    return script, DistillConfig(**base), ModelConfig(model_name_or_path=tiny["student"], dtype="float32")


def _changed(before: str, after: str) -> float:
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(before).state_dict()
    b = AutoModelForCausalLM.from_pretrained(after).state_dict()
    return sum(1 for k in a if not torch.equal(a[k], b[k])) / len(a)


def test_same_tokenizer_on_policy_distill_lowers_divergence(tiny, tmp_path):
    metrics = main(*_configs(tiny, tmp_path / "out", tiny["teacher"]))
    assert metrics["tokenizer_mode"] == "same"
    before, after = metrics["before"], metrics["after"]
    assert after["reverse_kl"] < 0.8 * before["reverse_kl"], (before, after)
    assert 0.0 <= after["accuracy"] <= 1.0 and after["num_tokens"] > 0
    assert _changed(tiny["student"], str(tmp_path / "out")) == 1.0  # every parameter tensor learned
    saved = json.loads((tmp_path / "out" / "distill_eval.json").read_text())
    assert saved["after"] == after
    # the same prompts before and after: per-row flags that make the accuracy, and the paired test over them
    assert len(before["correct"]) == len(after["correct"]) == after["num_prompts"]
    assert sum(after["correct"]) / after["num_prompts"] == after["accuracy"]
    assert saved["paired"]["gained"] - saved["paired"]["lost"] == sum(after["correct"]) - sum(before["correct"])
    assert 0.0 < saved["paired"]["p_value"] <= 1.0
    # the teacher's own accuracy, measured like the student's: evaluating the teacher as a student gives the same
    from align.data.loading import get_dataset
    from align.distill.metrics import evaluate
    from align.modeling.loading import load_model, load_tokenizer

    script, args, _ = _configs(tiny, tmp_path / "x", tiny["teacher"])
    teacher, tok = load_model(tiny["teacher"], dtype="float32"), load_tokenizer(tiny["student"])
    rows = get_dataset(script)["test"].select(range(6)).to_list()
    as_student = evaluate(
        teacher,
        teacher,
        tok,
        tok,
        rows,
        mode="same",
        max_new_tokens=args.distill_eval_max_new_tokens,
        teacher_prompts={},
    )
    assert saved["teacher_accuracy"] == metrics["teacher_accuracy"] == as_student["accuracy"]
    assert metrics["engine_calls"] == 5  # the student sampled through our engine, every step


def test_gold_cross_tokenizer_lowers_uld_distance_with_teacher_template(tiny, tmp_path):
    metrics = main(*_configs(tiny, tmp_path / "gold", tiny["cross_teacher"], teacher_strip_mode_flags=True))
    assert metrics["tokenizer_mode"] == "cross"
    before, after = metrics["before"], metrics["after"]
    assert after["uld_distance"] < before["uld_distance"], (before, after)
    assert metrics["teacher_prompt_misses"] == 0  # every prompt the teacher scored was in its own template
    assert _changed(tiny["student"], str(tmp_path / "gold")) > 0.9


def test_a_bfloat16_teacher_hands_float32_logits_to_gold_and_it_learns(tiny, tmp_path, monkeypatch):
    """teacher_dtype: bfloat16 (the demo's GOLD teacher): weights in bf16, logits in fp32 at the loss, and the ULD
    distance still falls; the student stays fp32."""
    from align.distill import trainer as distill

    seen = []
    load = distill.load_teacher
    monkeypatch.setattr(distill, "load_teacher", lambda *a, **k: seen.append(load(*a, **k)) or seen[-1])
    metrics = main(
        *_configs(
            tiny,
            tmp_path / "gold_bf16",
            tiny["cross_teacher"],
            teacher_strip_mode_flags=True,
            teacher_dtype="bfloat16",
        )
    )
    teacher = seen[0]
    assert teacher.dtype == torch.bfloat16
    ids = torch.tensor([[1, 2, 3]])
    assert teacher(input_ids=ids).logits.dtype == torch.float32
    assert metrics["after"]["uld_distance"] < metrics["before"]["uld_distance"]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "gold_bf16").dtype == torch.float32
    with pytest.raises(ValueError, match="teacher_dtype"):
        DistillConfig(output_dir="/tmp/unused", teacher_dtype="int8")


def test_teacher_prompts_use_the_teacher_template(tiny):
    args = DistillConfig(output_dir="/tmp/unused", teacher_strip_mode_flags=True)
    row = make_tasks(FAMILIES, num=1, seed=3)[0]
    convs = [to_messages(row, "no_think")]
    mapping = teacher_prompt_map(convs, tiny["ours"], tiny["other"], args)
    [(student_text, teacher_text)] = mapping.items()
    assert "/no_think" in student_text and "<think>" in student_text  # our template: mode flag + empty think
    assert teacher_text == (
        f"<|im_start|>system\nYou are a teacher.<|im_end|>\n<|im_start|>user\n{row['prompt']}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    kept = teacher_messages(convs[0][:2], strip_mode_flags=False)
    assert kept[0] == {"role": "system", "content": "/no_think"}


def test_teacher_few_shot_shows_solved_conversations_of_the_same_family_and_mode(tiny):
    rows = make_tasks(["arithmetic", "compare", "sort"], num=60, seed=4)
    convs = [to_messages(r, "think" if i % 2 else "no_think") for i, r in enumerate(rows)]
    groups = [r["family"] for r in rows]
    pool = FewShotPool(convs, groups, k=2, seed=0)
    for i, conv in enumerate(convs[:12]):
        prompt = conv[:-1]
        demos = pool.demos(prompt, groups[i])
        assert [m["role"] for m in demos] == ["user", "assistant"] * 2
        questions = [m["content"] for m in demos if m["role"] == "user"]
        assert prompt[-1]["content"] not in questions  # never its own answer
        for q in questions:  # same family, same /think or /no_think turn
            j = next(j for j, c in enumerate(convs) if c[1]["content"] == q)
            assert groups[j] == groups[i] and convs[j][0] == conv[0]
        assert pool.demos(prompt, groups[i]) == demos  # the same demonstrations every time
    assert FewShotPool(convs, groups, k=0).demos(convs[0][:-1], groups[0]) == []
    # a prompt with no group (an eval row without the column) still gets k demonstrations of its system turn
    free = pool.demos(convs[0][:-1], None)
    assert len(free) == 4 and all(
        next(c for c in convs if c[1]["content"] == q["content"])[0] == convs[0][0] for q in free[::2]
    )

    args = DistillConfig(output_dir="/tmp/unused", teacher_strip_mode_flags=True)
    [teacher_text] = teacher_prompt_map(convs[:1], tiny["ours"], tiny["other"], args, pool, groups[:1]).values()
    demo_answer = pool.demos(convs[0][:-1], groups[0])[1]["content"]
    # the demonstration comes before the question, and the teacher's turn starts after the question
    assert teacher_text.index(demo_answer) < teacher_text.index(rows[0]["prompt"])
    assert teacher_text.endswith(f"{rows[0]['prompt']}<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="teacher_few_shot"):
        DistillConfig(output_dir="/tmp/unused", teacher_few_shot=-1)


def test_teacher_hint_is_privileged_context_the_student_never_sees(tiny):
    rows = make_tasks(["arithmetic", "compare"], num=40, seed=5)
    convs = [to_messages(r, "no_think") for r in rows]
    groups = [r["family"] for r in rows]
    hint = " (The correct final answer is {answer}.)"
    hints = teacher_hints(rows, hint)
    assert hints[0] == f" (The correct final answer is {rows[0]['answer']}.)"
    pool = FewShotPool(convs, groups, k=2, seed=0, hints=hints)
    args = DistillConfig(output_dir="/tmp/unused", teacher_strip_mode_flags=True, teacher_hint=hint)
    mapping = teacher_prompt_map(convs[:3], tiny["ours"], tiny["other"], args, pool, groups[:3], hints[:3])
    for (student_text, teacher_text), row in zip(mapping.items(), rows[:3], strict=True):
        assert "correct final answer" not in student_text  # the student's prompt is untouched
        # the question carries its own answer, just before the teacher's turn; each demonstration carries its own
        assert teacher_text.endswith(f"{row['prompt']}{hints[rows.index(row)]}<|im_end|>\n<|im_start|>assistant\n")
        assert teacher_text.count("correct final answer") == 3
    demos = pool.demos(convs[0][:-1], groups[0])
    assert rows[0]["prompt"] not in [d["content"].split(" (The")[0] for d in demos]  # never its own, hint or not
    for d in demos[::2]:
        j = next(j for j, r in enumerate(rows) if d["content"] == r["prompt"] + hints[j])
        assert groups[j] == groups[0]
    assert teacher_hints(rows, None) is None
    with pytest.raises(ValueError, match="teacher_hint .*'solution'"):
        teacher_hints(rows, "{solution}")
    for bad in ("{answer", "{0}"):  # not a format over named columns: a message, not a traceback
        with pytest.raises(ValueError, match="not a usable format string"):
            teacher_hints(rows, bad)


def test_same_tokenizer_run_with_a_hinted_teacher_uses_its_view_everywhere(tiny, tmp_path):
    """main() with one tokenizer and teacher_hint: every training prompt and every eval prompt is found in the
    teacher's view (no misses), and the divergence it reports and lowers is the one to the hinted teacher."""
    metrics = main(*_configs(tiny, tmp_path / "out", tiny["teacher"], teacher_hint=" (answer: {answer})"))
    assert metrics["tokenizer_mode"] == "same" and metrics["teacher_prompt_misses"] == 0
    plain = main(*_configs(tiny, tmp_path / "plain", tiny["teacher"], max_steps=1, distill_eval=True))
    # the same student, the same greedy answers: only the teacher's prompt differs, so its divergence does
    assert metrics["before"]["num_tokens"] == plain["before"]["num_tokens"]
    assert metrics["before"]["reverse_kl"] != pytest.approx(plain["before"]["reverse_kl"], rel=1e-4)
    assert metrics["after"]["reverse_kl"] < metrics["before"]["reverse_kl"]


def _on_policy_batch(tok, prompts: list[list[int]], completions: list[list[int]]):
    """TRL's on-policy layout: prompts left-padded, completions right-padded, labels only on completion tokens."""
    pw, cw = max(map(len, prompts)), max(map(len, completions))
    pad = tok.pad_token_id
    ids = [[pad] * (pw - len(p)) + p + c + [pad] * (cw - len(c)) for p, c in zip(prompts, completions, strict=True)]
    mask = [[0] * (pw - len(p)) + [1] * (len(p) + len(c)) + [0] * (cw - len(c)) for p, c in zip(prompts, completions)]
    labels = [[-100] * pw + c + [-100] * (cw - len(c)) for c in completions]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor(labels)}


def test_same_tokenizer_teacher_view_loss_is_gkd_on_the_teachers_own_prompt(tiny):
    """teacher_hint / teacher_few_shot with one tokenizer: the student's completion tokens follow the teacher's prompt
    in the teacher's pass. With the teacher's view equal to the student's, the loss is TRL's own GKD loss; with a
    hint it is the reverse KL to the teacher reading the hint, token for token."""
    from types import SimpleNamespace

    from trl.experimental.gold import GOLDTrainer

    from align.distill import DistillTrainer
    from align.distill.metrics import render_prompts
    from align.modeling.loading import load_model, load_tokenizer

    tok = load_tokenizer(tiny["student"])
    student, teacher = load_model(tiny["student"], dtype="float32"), load_model(tiny["teacher"], dtype="float32")
    rows = make_tasks(FAMILIES, num=3, seed=7)
    convs = [to_messages(r, "no_think")[:-1] for r in rows]
    prompts = render_prompts(tok, convs)
    assert len({len(p) for p in prompts}) > 1  # prompts of different lengths: left padding is exercised
    completions = [
        tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for t in ("The answer is \\boxed{4}.", "\\boxed{12}", "It is \\boxed{7}")
    ]
    batch = _on_policy_batch(tok, prompts, completions)
    texts = [tok.decode(p, skip_special_tokens=False) for p in prompts]

    def loss_with(view: dict[str, str], chunk: int = 0):
        fake = SimpleNamespace(
            processing_class=tok,
            teacher_model=teacher,
            pad_token_id=tok.pad_token_id,
            beta=1.0,
            temperature=1.0,
            generalized_jsd_loss=GOLDTrainer.generalized_jsd_loss,
            teacher_prompts=view,
            teacher_prompt_misses=0,
            args=SimpleNamespace(loss="reverse_kl", loss_chunk_tokens=chunk),
        )
        fake._teacher_prompt_text = lambda text: DistillTrainer._teacher_prompt_text(fake, text)
        fake._chunked_loss = lambda *a: DistillTrainer._chunked_loss(fake, *a)
        with torch.no_grad():
            loss, _ = DistillTrainer._same_vocab_teacher_view_loss(fake, student, batch)
        return float(loss), fake.teacher_prompt_misses

    with torch.no_grad():  # TRL's GKD path: the teacher reads exactly the student's tokens
        s_logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        t_logits = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        gkd = float(
            GOLDTrainer.generalized_jsd_loss(s_logits[:, :-1], t_logits[:, :-1], batch["labels"][:, 1:], beta=1.0)
        )
    same, misses = loss_with({t: t for t in texts})
    assert misses == 0 and same == pytest.approx(gkd, rel=1e-4)

    args = DistillConfig(output_dir="/tmp/unused", teacher_hint=" (answer: {answer})")
    view = teacher_prompt_map(
        [c + [{"role": "assistant", "content": "x"}] for c in convs],
        tok,
        tok,
        args,
        hints=teacher_hints(rows, args.teacher_hint),
    )
    assert set(view) == set(texts)
    hinted, misses = loss_with(view)
    total, count = 0.0, 0
    with torch.no_grad():  # the reference: each row alone, the teacher on its hinted prompt
        for p, c, text in zip(prompts, completions, texts, strict=True):
            tp = tok(view[text], add_special_tokens=False)["input_ids"]
            assert "(answer: " in tok.decode(tp) and len(tp) > len(p)
            s = torch.log_softmax(student(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1], -1)
            t = torch.log_softmax(teacher(input_ids=torch.tensor([tp + c])).logits[0, len(tp) - 1 : -1], -1)
            total += float((s.exp() * (s - t)).sum())
            count += len(c)
    assert misses == 0 and hinted == pytest.approx(total / count, rel=1e-4)
    assert loss_with(view, chunk=5)[0] == pytest.approx(hinted, rel=1e-5)  # loss_chunk_tokens: the same loss
    assert hinted != pytest.approx(gkd, rel=5e-4)  # the hint changed what the (untrained) teacher says
    _, misses = loss_with({})  # a prompt with no teacher rendering is counted, the teacher reads the student's
    assert misses == 3


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_chunked_loss_gives_the_whole_logits_loss_and_gradients(tiny, beta):
    """loss_chunk_tokens: both heads and TRL's generalized JSD over a few completion positions at a time (even,
    ragged, one chunk) give TRL's whole-logits loss and the same gradients, forward and reverse KL and the mixture."""
    from types import SimpleNamespace

    from trl.experimental.gold import GOLDTrainer

    from align.distill import DistillTrainer
    from align.distill.metrics import render_prompts
    from align.modeling.loading import load_model, load_tokenizer

    tok = load_tokenizer(tiny["student"])
    student, teacher = load_model(tiny["student"], dtype="float32"), load_model(tiny["teacher"], dtype="float32")
    rows = make_tasks(FAMILIES, num=3, seed=3)
    prompts = render_prompts(tok, [to_messages(r, "no_think")[:-1] for r in rows])
    completions = [
        tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for t in ("The answer is \\boxed{4}.", "\\boxed{12}", "so it is \\boxed{7} then")
    ]
    batch = _on_policy_batch(tok, prompts, completions)
    params = [p for p in student.parameters() if p.requires_grad]
    s_logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    with torch.no_grad():
        t_logits = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    whole = GOLDTrainer.generalized_jsd_loss(
        s_logits[:, :-1], t_logits[:, :-1], batch["labels"][:, 1:], beta=beta, temperature=0.9
    )
    grads = torch.autograd.grad(whole, params)
    for chunk in (4, 7, 1000):
        fake = SimpleNamespace(
            teacher_model=teacher,
            beta=beta,
            temperature=0.9,
            teacher_prompts={},
            args=SimpleNamespace(loss="reverse_kl", loss_chunk_tokens=chunk),
        )
        fake._chunked_loss = lambda *a, fake=fake: DistillTrainer._chunked_loss(fake, *a)
        chunked = DistillTrainer.compute_loss(fake, student, batch)
        assert chunked.item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-7)
        for a, b in zip(grads, torch.autograd.grad(chunked, params), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert "forward" not in vars(student.get_output_embeddings())  # the head is itself again after the pass


def test_teacher_accuracy_scores_the_teachers_own_greedy_answers(tiny, monkeypatch):
    import align.distill.metrics as dm
    from align.data.loading import get_dataset
    from align.modeling.loading import load_tokenizer

    script, _, _ = _configs(tiny, "unused", tiny["teacher"])
    rows = get_dataset(script)["test"].select(range(4)).to_list()
    tok = load_tokenizer(tiny["student"])
    called = []

    def fake_engine(model, tokenizer, *a):  # the engine around the teacher: right on rows 0 and 2
        def generate(prompt_ids, params):
            called.append((model, [tokenizer.decode(p) for p in prompt_ids], params.max_new_tokens))
            texts = [f"\\boxed{{{r['answer']}}}" if i % 2 == 0 else "\\boxed{12345}" for i, r in enumerate(rows)]
            ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
            return [[SimpleNamespace(completion_ids=c, finish_reason="stop")] for c in ids]

        return generate

    monkeypatch.setattr(dm, "model_generate", fake_engine)
    assert all(r["answer"] != "12345" for r in rows)
    assert dm.teacher_accuracy("the-teacher", tok, rows, 7) == 0.5
    ((model, prompts, max_new),) = called
    assert (model, len(prompts), max_new) == ("the-teacher", 4, 7)
    assert all(r["prompt"] in p and "(answer:" not in p for p, r in zip(prompts, rows, strict=True))
    # with its own view (teacher_prompts: student text -> teacher text) the teacher answers the prompts it grades
    args = DistillConfig(output_dir="/tmp/unused", teacher_hint=" (answer: {answer})")
    convs = [r["prompt_messages"] for r in rows]
    view = teacher_prompt_map(convs, tok, tok, args, hints=teacher_hints(rows, args.teacher_hint))
    dm.teacher_accuracy("the-teacher", tok, rows, 7, teacher_prompts=view)
    hinted = called[-1][1]
    assert all(f"(answer: {r['answer']})" in p for p, r in zip(hinted, rows, strict=True))


def _best_of_engine(tok, rows_by_prompt: dict, n: int, calls: list):
    """A teacher engine for rejection_sampling. `rows_by_prompt`: question -> (its row's index i in its split, row).
    Of prompt i's n samples (its k-th appearance is sample k) only sample i % n answers it right, in the shape its
    mode wants (the gold conversation's text); every third row gets no right answer; the other samples answer wrong
    or, for sample (i + 1) % n, right but without the think block its mode asks for."""
    from data_gen.tasks import assistant_text

    seen: dict[str, int] = {}

    def make(model, tokenizer, *a):
        def generate(prompt_ids, params):
            calls.append((len(prompt_ids), params.temperature, params.max_new_tokens, params.seed))
            out = []
            for ids in prompt_ids:
                text = tok.decode(ids)
                question = max((p for p in rows_by_prompt if p in text), key=len)
                (i, row), k = rows_by_prompt[question], seen.get(question, 0)
                seen[question] = k + 1
                mode = "no_think" if "/no_think" in text else "think"
                right_bare = f"The answer is \\boxed{{{row['answer']}}}."
                answer = (
                    assistant_text(row, mode)
                    if k == i % n and i % 3 != 2
                    else right_bare
                    if k == (i + 1) % n and mode == "think"
                    else "\\boxed{12345}"
                )
                out.append(
                    [
                        SimpleNamespace(
                            completion_ids=tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                            finish_reason="stop",
                        )
                    ]
                )
            return out

        return generate

    return make


def test_rejection_sampling_teacher_keeps_its_first_verified_answer_in_the_asked_modes_shape(tiny, monkeypatch):
    import align.distill.rejection as dt
    from align.distill.trainer import prepare_conversations, teacher_answers
    from data_gen.tasks import assistant_text

    rows = make_tasks(FAMILIES, num=9, seed=7)
    modes = ["think", "no_think", "think"] * 3
    data = {
        "train": __import__("datasets").Dataset.from_list(
            [
                {
                    "prompt_messages": to_messages(r, m)[:2],
                    "answer": r["answer"],
                    "reward": "math_reward",
                    "prompt": r["prompt"],
                    "family": r["family"],
                    "think": r.get("think", ""),
                }
                for r, m in zip(rows, modes)
            ]
        )
    }
    args = DistillConfig(
        output_dir="/tmp/unused",
        loss="rejection_sampling",
        teacher_best_of=3,
        temperature=0.8,
        max_completion_length=24,
        seed=5,
    )
    conv = prepare_conversations(data, args, 0)
    kept = [i for i in range(9) if i % 3 != 2]  # every third row: no verified answer, dropped
    # a prompt is sampled until its first accepted answer: row i's is sample i % 3 (none for i % 3 == 2), so the 9
    # prompts are sampled 9 + 6 + 3 times, one call per sample round, or 4 samples a call; each call a seed of its own
    for per_call, sizes in ((512, [9, 6, 3]), (4, [4, 4, 1, 4, 2, 3])):
        calls = []
        monkeypatch.setattr(dt, "SAMPLES_PER_LOG", per_call)
        monkeypatch.setattr(
            dt,
            "model_generate",
            _best_of_engine(tiny["ours"], {r["prompt"]: (i, r) for i, r in enumerate(rows)}, 3, calls),
        )
        train = teacher_answers(conv, torch.nn.Linear(1, 1), tiny["ours"], args)
        seeds = [5 + sum(sizes[:j]) for j in range(len(sizes))]
        assert [(c[0], c[3], c[1], c[2]) for c in calls] == [(n, s, 0.8, 24) for n, s in zip(sizes, seeds)]
        assert len(train) == len(kept)
        for row, i in zip(train, kept, strict=True):
            assert row["messages"][:-1] == data["train"][i]["prompt_messages"]
            # the verified answer in the asked mode's shape, never the right-but-bare one of sample (i + 1) % 3
            assert row["messages"][-1] == {"role": "assistant", "content": assistant_text(rows[i], modes[i])}


def test_teacher_thinks_answers_no_think_prompts_thinking_and_the_student_learns_the_conclusion(tiny, monkeypatch):
    """`teacher_thinks`: a teacher that answers right only when it reasons (every /no_think sample wrong, every
    /think one right in the think shape) hands the no_think rows nothing as asked; shown /think instead, it hands
    them its verified conclusion in the no_think form (no think block), and the think rows are sampled as before."""
    import align.distill.rejection as dt
    from data_gen.tasks import assistant_text

    rows = make_tasks(FAMILIES, num=6, seed=3)
    modes = ["think", "no_think"] * 3
    table = [
        {
            "prompt_messages": to_messages(r, m)[:2],
            "answer": r["answer"],
            "reward": "math_reward",
            "prompt": r["prompt"],
        }
        for r, m in zip(rows, modes)
    ]
    tok, shown = tiny["ours"], []

    def make(model, tokenizer, *a):
        def generate(prompt_ids, params):
            out = []
            for ids in prompt_ids:
                text = tok.decode(ids)
                shown.append(text)
                row = next(r for r in rows if r["prompt"] in text)
                answer = "\\boxed{12345}" if "/no_think" in text else assistant_text(row, "think")
                out.append(
                    [
                        SimpleNamespace(
                            completion_ids=tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                            finish_reason="stop",
                        )
                    ]
                )
            return out

        return generate

    monkeypatch.setattr(dt, "model_generate", make)
    convs = [r["prompt_messages"] for r in table]
    asked = DistillConfig(
        output_dir="/tmp/unused", loss="rejection_sampling", teacher_best_of=2, max_completion_length=48
    )
    answers = dt.best_of_samples(torch.nn.Linear(1, 1), tok, table, convs, asked)
    assert answers == [assistant_text(r, "think") if m == "think" else None for r, m in zip(rows, modes)]
    assert sum("/no_think" in t for t in shown) == 6  # 3 no_think prompts x 2 samples, shown as asked

    shown.clear()
    thinking = DistillConfig(
        output_dir="/tmp/unused",
        loss="rejection_sampling",
        teacher_best_of=2,
        max_completion_length=48,
        teacher_thinks=True,
    )
    answers = dt.best_of_samples(torch.nn.Linear(1, 1), tok, table, convs, thinking)
    assert not any("/no_think" in t for t in shown) and len(shown) == 6  # each right at its first sample
    # think rows: the whole think answer; no_think rows: its conclusion alone, the no_think form
    assert answers == [assistant_text(r, m) for r, m in zip(rows, modes)]
    assert [convs[i][0]["content"] for i in (0, 1)] == ["/think", "/no_think"]  # the rows themselves untouched
    with pytest.raises(ValueError, match="teacher_thinks.*rejection_sampling.*teacher_strip_mode_flags"):
        DistillConfig(
            output_dir="/tmp/unused", loss="rejection_sampling", teacher_thinks=True, teacher_strip_mode_flags=True
        )


def test_rejection_sampling_needs_verifiable_rows_and_a_positive_best_of():
    from datasets import Dataset

    from align.distill.trainer import prepare_conversations

    args = DistillConfig(output_dir="/tmp/unused", loss="rejection_sampling")
    chat = Dataset.from_list(
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    )
    with pytest.raises(ValueError, match="rejection_sampling.*'answer' and 'reward' columns.*messages"):
        prepare_conversations({"train": chat}, args, 0)
    with pytest.raises(ValueError, match="teacher_best_of must be >= 1"):
        DistillConfig(output_dir="/tmp/unused", teacher_best_of=0)


def test_rejection_sampling_replay_rows_join_the_verified_answers(tmp_path):
    from datasets import Dataset

    from align.distill.trainer import add_replay_conversations

    answer = [
        {"role": "system", "content": "/think"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\n2 + 2 = 4\n</think>\nThe answer is \\boxed{4}."},
    ]
    verified = Dataset.from_list([{"messages": answer}])
    chat = [
        {
            "messages": [
                {"role": "user", "content": f"Tell me about {x}."},
                {"role": "assistant", "content": f"{x} is nice.", "name": "bot"},
            ]
        }
        for x in ("tea", "rain")
    ]
    path = tmp_path / "replay.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in chat))
    train = add_replay_conversations(verified, str(path))
    assert train["messages"] == [answer] + [
        [{k: m[k] for k in ("role", "content")} for m in r["messages"]] for r in chat
    ]
    assert add_replay_conversations(verified, str(path), limit=1)["messages"][1][0]["content"] == "Tell me about tea."
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 is not a conversation \(\{role, content\} turns\) ending in an"):
        add_replay_conversations(verified, str(path))
    path.write_text(json.dumps({"messages": [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "yo"}]}))
    with pytest.raises(ValueError, match="row 0 is not a conversation"):  # not a KeyError from deep inside
        add_replay_conversations(verified, str(path))
    with pytest.raises(ValueError, match="replay_data is learned with rejection_sampling.*loss 'reverse_kl'"):
        DistillConfig(output_dir="/tmp/unused", replay_data=str(path))


def test_rejection_sampling_run_learns_the_verified_answers_and_measures_the_teacher_per_mode(
    tiny, tmp_path, monkeypatch
):
    import align.distill.rejection as dt
    from align.data.loading import get_dataset
    from align.distill.trainer import DistillTrainer
    from align.eval.multiple_choice import sequence_logprobs
    from align.modeling.loading import load_model, load_tokenizer

    replay = tmp_path / "replay"  # the replay stage's shape: a directory with train.jsonl
    replay.mkdir()
    (replay / "train.jsonl").write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w}!"}]}
            )
            + "\n"
            for w in ("yes", "no", "maybe")
        )
    )
    script, args, model = _configs(
        tiny,
        tmp_path / "out",
        tiny["student"],
        loss="rejection_sampling",
        teacher_best_of=2,
        max_steps=8,
        replay_data=str(replay),
    )
    script.dataset_args = {**script.dataset_args, "mode": "mixed"}
    data = get_dataset(script)
    index = {r["prompt"]: (i, r) for split in ("train", "test") for i, r in enumerate(data[split].to_list())}
    calls = []
    monkeypatch.setattr(dt, "model_generate", _best_of_engine(tiny["ours"], index, 2, calls))
    seen = []
    monkeypatch.setattr(DistillTrainer, "__init__", _recording_init(DistillTrainer.__init__, seen))
    metrics = main(script, args, model)
    train = seen[0]
    assert len(train) == sum(1 for i in range(len(data["train"])) if i % 3 != 2) + 3  # + the replay rows
    assert train["messages"][-1] == [
        {"role": "user", "content": "Say maybe."},
        {"role": "assistant", "content": "maybe!"},
    ]
    # the held-out teacher: its verified best of 2 on the 6 held-out rows, per asked mode, from its own samples
    best = metrics["teacher_best_of"]
    assert best["correct"] == [int(i % 3 != 2) for i in range(6)] and best["accuracy"] == 4 / 6
    rows = data["test"].select(range(6)).to_list()
    by = {}
    for r, flag in zip(rows, best["correct"], strict=True):
        by.setdefault("no_think" if "/no_think" in r["prompt_messages"][0]["content"] else "think", []).append(flag)
    assert best["by_mode"] == {m: sum(v) / len(v) for m, v in sorted(by.items())} and len(by) == 2
    assert set(metrics["after"]["by_mode"]) == set(by)
    assert metrics["engine_calls"] == 0  # no student sampling: the teacher wrote every answer once, before training
    # what was learned: the student's likelihood of the verified answers it trained on went up
    tok = load_tokenizer(tiny["student"])

    def nll(path):
        m = load_model(path, dtype="float32")
        seqs = []
        for row in train:
            prompt = tok.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=False)
            full = tok.apply_chat_template(row["messages"], tokenize=False)
            ids = tok(full, add_special_tokens=False)["input_ids"]
            seqs.append((ids, len(ids) - len(tok(prompt, add_special_tokens=False)["input_ids"])))
        scores = sequence_logprobs(m, seqs)
        return -sum(s for s, _ in scores) / sum(n for _, n in scores)

    assert nll(str(tmp_path / "out")) < 0.8 * nll(tiny["student"])


@pytest.mark.parametrize("student,bf16", [("previous", False), ("start", True)])
def test_expert_iteration_samples_each_round_from_the_model_the_last_one_made(
    student, bf16, tiny, tmp_path, monkeypatch
):
    """rejection_rounds: 2: round 2's teacher is round 1's saved model (output_dir/round-1), and so is its student
    ('previous') or the stage's starting model again ('start', ReST-EM); the stage's report judges round 1's before
    against round 2's after; a rerun skips the finished round."""
    import align.distill.rejection as dt
    from align.data.loading import get_dataset
    from align.eval.statistics import paired_change

    out = tmp_path / "out"
    script, args, model = _configs(
        tiny,
        out,
        tiny["student"],
        loss="rejection_sampling",
        teacher_best_of=2,
        max_steps=4,
        rejection_rounds=2,
        rejection_round_student=student,
        bf16=bf16,
    )
    script.dataset_args = {**script.dataset_args, "mode": "mixed"}
    data = get_dataset(script)
    index = {r["prompt"]: (i, r) for split in ("train", "test") for i, r in enumerate(data[split].to_list())}
    teachers, calls = [], []

    def engine(model, tokenizer, *a):  # a fresh engine per sampling call, recording whose weights sample
        teachers.append(model.config.name_or_path)
        return _best_of_engine(tiny["ours"], index, 2, calls)(model, tokenizer, *a)

    import align.distill.held_out as dho

    answered, real_evaluate = [], dho.evaluate

    def evaluate(*a, **kw):  # records each held-out pass's greedy answers and whether it was handed them
        result = real_evaluate(*a, **kw)
        answered.append((kw.get("records") is not None, [r["completion_ids"] for r in kw["keep"]]))
        return result

    monkeypatch.setattr(dt, "model_generate", engine)
    monkeypatch.setattr(dho, "evaluate", evaluate)
    metrics = main(script, args, model)
    round_1 = str(out / "round-1")
    # round 1: the training prompts, then the held-out ones, from the given teacher; round 2 from round 1's model
    assert teachers == [tiny["student"]] * 2 + [round_1] * 2
    first = json.loads((out / "round-1" / "distill_eval.json").read_text())
    assert _changed(tiny["student"], round_1) > 0.5
    # 'previous' trains round 1's model further; 'start' trains the starting model again, and as this fake teacher
    # hands round 2 the same answers (same seed), it lands on round 1's weights exactly
    assert _changed(round_1, str(out)) > 0.5 if student == "previous" else _changed(round_1, str(out)) == 0
    # round 2's student started where round 1 ended, or where the stage started
    second_before = json.loads((out / "distill_eval.json").read_text())["rounds"][1]["before"]
    assert second_before == (first["after"] if student == "previous" else first["before"])["accuracy"]
    if student == "start":  # both rounds trained the starting model: round 2's weights are not round 1's plus more
        assert first["before"]["correct"] == metrics["before"]["correct"]
    assert metrics["before"] == first["before"] and metrics["rejection_rounds"] == 2
    assert metrics["paired"] == paired_change(first["before"]["correct"], metrics["after"]["correct"])
    assert json.loads((out / "distill_eval.json").read_text())["paired"] == metrics["paired"]
    assert [r["round"] for r in metrics["rounds"]] == [1, 2]
    # held-out answers are made once per weights: round 1's teacher is its student (its accuracy is the before's);
    # round 2's teacher is round 1's saved model, answered in round 1's after; its student round 1's or the start's
    assert first["reused"] == {"before": {"teacher": str(Path(tiny["student"]).resolve())}}
    assert first["teacher_accuracy"] == first["before"]["accuracy"]
    assert metrics["reused"]["before"] == {
        "student": str((out / "round-1").resolve() if student == "previous" else Path(tiny["student"]).resolve()),
        "teacher": str((out / "round-1").resolve()),
    }
    # round 1 before and after, round 2 before (handed round 1's answers), round 2 after: three greedy passes made
    assert [given for given, _ in answered] == [False, False, True, False]
    # ... and what was read equals what the saved round-1 model answers when loaded and asked again
    from align.distill.metrics import greedy_completions, teacher_accuracy
    from align.modeling.loading import load_model, load_tokenizer

    rows = data["test"].select(range(script.eval_num_prompts)).to_list()
    saved, tok = load_model(round_1, dtype="float32"), load_tokenizer(tiny["student"])
    _, fresh = greedy_completions(saved, tok, [r["prompt_messages"] for r in rows], args.distill_eval_max_new_tokens)
    assert fresh == answered[1][1]  # round 1's after, answer for answer
    assert answered[2][1] == (answered[1][1] if student == "previous" else answered[0][1])
    assert metrics["teacher_accuracy"] == teacher_accuracy(saved, tok, rows, args.distill_eval_max_new_tokens)
    # a rerun (the last round lost) skips round 1 and samples only from its model
    (out / "distill_eval.json").unlink()
    teachers.clear()
    again = main(script, args, model)
    assert teachers == [round_1] * 2 and again["before"] == first["before"]
    with pytest.raises(ValueError, match="rejection_rounds=2 repeats rejection sampling.*loss 'reverse_kl'"):
        DistillConfig(output_dir="/tmp/unused", rejection_rounds=2)
    with pytest.raises(ValueError, match="rejection_round_student 'last': choose 'previous'"):
        DistillConfig(output_dir="/tmp/unused", loss="rejection_sampling", rejection_round_student="last")


def test_held_out_answers_are_reused_only_for_the_same_weights_dtype_prompts_and_budget(tiny, tmp_path):
    """`answers_key`: what lets a distillation round read greedy answers made earlier instead of generating them."""
    from align.distill.held_out import answers_key
    from align.modeling.loading import load_model

    rows = [{"prompt_messages": [{"role": "user", "content": f"q{i}"}]} for i in range(3)]
    args = _configs(tiny, tmp_path / "out", tiny["student"])[1]
    fp32, bf16 = load_model(tiny["student"], dtype="float32"), load_model(tiny["student"], dtype="bfloat16")
    key = answers_key(tiny["student"], fp32, rows, args)
    (tmp_path / "link").symlink_to(tiny["student"])
    assert answers_key(str(tmp_path / "link"), fp32, rows, args) == key  # the same directory, spelled otherwise
    assert answers_key(tiny["teacher"], fp32, rows, args) != key  # other weights
    assert answers_key(tiny["student"], bf16, rows, args) != key  # another dtype answers otherwise
    assert answers_key(tiny["student"], fp32, rows[:2], args) != key  # other prompts
    longer = _configs(tiny, tmp_path / "out", tiny["student"], distill_eval_max_new_tokens=20)[1]
    assert answers_key(tiny["student"], fp32, rows, longer) != key  # another budget
    # its forward under mixed precision's autocast, as accelerate's prepare_model wraps it (no Accelerator here: its
    # process-wide state would outlive the test)
    fp32._original_forward = fp32.forward
    fp32.forward = torch.autocast("cpu", dtype=torch.bfloat16)(fp32.forward)
    assert answers_key(tiny["student"], fp32, rows, args) != key


def _recording_init(init, seen):
    def record(self, *a, **kw):
        seen.append(kw["train_dataset"])
        init(self, *a, **kw)

    return record


def test_rejection_sampling_loss_is_the_models_own_next_token_loss_on_the_answer(tiny):
    from types import MethodType

    from align.distill.trainer import DistillTrainer
    from align.modeling.loading import load_model

    model = load_model(tiny["student"], dtype="float32")
    ids = torch.tensor([[5, 9, 17, 3, 44, 2, 0], [7, 8, 30, 31, 12, 6, 19]])
    mask = torch.ones_like(ids)
    mask[0, -1] = 0
    labels = ids.clone()
    labels[:, :3] = -100  # the prompt
    labels[0, -1] = -100  # padding
    fake = SimpleNamespace(args=SimpleNamespace(loss="rejection_sampling"))
    fake._answer_nll = MethodType(DistillTrainer._answer_nll, fake)
    ours = DistillTrainer.compute_loss(fake, model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss  # transformers' own causal LM loss
    assert torch.allclose(ours, reference, atol=1e-6)
    # with the trainer's count of answer tokens over the accumulated batches, the sum is divided by that instead
    summed = DistillTrainer.compute_loss(
        fake, model, {"input_ids": ids, "attention_mask": mask, "labels": labels}, num_items_in_batch=torch.tensor(20)
    )
    assert torch.allclose(summed, reference * 7 / 20, atol=1e-6)  # 7 answer tokens


def test_unloadable_teacher_tokenizer_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(ValueError, match="cannot load the teacher tokenizer.*no_tokenizer"):
        main(*_configs(tiny, tmp_path / "x", tiny["no_tokenizer"]))


def test_same_mode_with_mismatched_vocabularies_suggests_gold(tiny):
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(tiny["student"])
    teacher = AutoModelForCausalLM.from_pretrained(tiny["cross_teacher"])
    with pytest.raises(ValueError, match="tokenizer_mode: cross"):
        resolve_tokenizer_mode("same", tiny["ours"], tiny["other"], student, teacher)
    assert resolve_tokenizer_mode("auto", tiny["ours"], tiny["other"], student, teacher) == "cross"
    assert resolve_tokenizer_mode("auto", tiny["ours"], tiny["ours"], student, student) == "same"


@pytest.mark.parametrize("loss", list(LOSSES))
def test_loss_sets_beta_and_lmbda(loss):
    args = DistillConfig(output_dir="/tmp/unused", loss=loss, beta=0.3, lmbda=0.7)
    beta, lmbda = LOSSES[loss]
    assert (args.beta, args.lmbda) == (0.3 if beta is None else beta, 0.7 if lmbda is None else lmbda)


def test_bad_config_values_name_the_field():
    with pytest.raises(ValueError, match="loss 'kl'"):
        DistillConfig(output_dir="/tmp/unused", loss="kl")
    with pytest.raises(ValueError, match="tokenizer_mode"):
        DistillConfig(output_dir="/tmp/unused", tokenizer_mode="other")


def test_engine_adapter_samples_per_unique_prompt_and_syncs():
    from types import SimpleNamespace

    from align.rollout.sampler import Sampler

    class Rollout:
        def __init__(self, ids):
            self.completion_ids, self.finish_reason = ids, "stop"

    class FakeEngine:
        synced = None

        def generate(self, prompts, params):
            assert params.seed is not None and params.n == 2  # a fresh per-rank seed for every call
            return [[Rollout([p[0], k]) for k in range(params.n)] for p in prompts]

        model = None  # holds its own copy: weights must be pushed

        def update_weights(self, named):
            self.synced = {n: t.clone() for n, t in named}

    model = torch.nn.Linear(2, 2)
    engine = FakeEngine()
    trainer = SimpleNamespace(model_wrapped=model, state=SimpleNamespace(global_step=0))
    gen = EngineGeneration(
        Sampler(engine, None, seed=0), trainer, DistillConfig(output_dir="/tmp/unused"), stop_token_ids=[0]
    )
    prompts, completions, _, _ = gen.generate([[5], [5], [7], [7]], num_generations=2)
    assert completions == [[5, 0], [5, 1, 0], [7, 0], [7, 1, 0]]  # stop token appended once
    gen.sync_weights()
    assert set(engine.synced) == {"weight", "bias"} and gen.num_syncs == 1


def test_the_smollm3_pipeline_places_its_teacher_where_the_launch_allows(monkeypatch):
    """The pipeline launched distill under zero3.yaml with teacher_device cuda:1 + 8bit, which check_teacher_placement
    refuses (the CPU rehearsal nulls both keys, so it never saw it). Each distill stage's own launch config must
    accept its recipe's teacher keys, and a fixed teacher_device is refused on more than one rank."""
    import yaml

    from align.distill import trainer as distill
    from align.pipeline.plan import ROOT as REPO_ROOT

    pipeline = yaml.safe_load((REPO_ROOT / "recipes" / "smollm3/pipeline.yaml").read_text())
    stages = [s for s in pipeline["stages"] if s["script"] == "distill"]
    assert stages
    for s in stages:
        zero = yaml.safe_load((REPO_ROOT / s["accelerate_config"]).read_text()).get("deepspeed_config", {})
        recipe = yaml.safe_load((REPO_ROOT / s["recipe"]).read_text())
        args = DistillConfig(
            output_dir="/tmp/unused",
            teacher_model_name_or_path=recipe["teacher_model_name_or_path"],
            teacher_device=recipe.get("teacher_device"),
            teacher_quantization=recipe.get("teacher_quantization"),
        )
        monkeypatch.setattr(distill, "is_zero3", lambda stage=zero.get("zero_stage"): stage == 3)
        monkeypatch.setenv("WORLD_SIZE", "8")
        distill.check_teacher_placement(args)  # one node of 8 GPUs: accepted
    args.teacher_device = "cuda:1"
    with pytest.raises(ValueError, match="all 8 ranks' teachers on that one GPU"):
        distill.check_teacher_placement(args)
    monkeypatch.setenv("WORLD_SIZE", "1")
    distill.check_teacher_placement(args)  # one process: a second GPU for the teacher is fine
