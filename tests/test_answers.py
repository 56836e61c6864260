"""data_gen/answers.py: replay rows are the model's own finished answers, in the SFT shape, with the mode's flag."""

import json

import pytest
from cpu_substitutions import build

import data_gen.answers as answers
from align.data.loading import load_source
from align.rollout import Rollout
from data_gen.answers import AnswerDataConfig, generate_answers, prompts_of


class FakeEngine:
    """Answers prompt i with a fixed text; the 2nd runs out of budget, the 3rd is empty."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def generate(self, prompts, params):
        self.prompts = prompts
        out = []
        for i, p in enumerate(prompts):
            ids = [] if i == 2 else self.tok(f"answer number {i}", add_special_tokens=False)["input_ids"]
            out.append([Rollout(list(p), ids, None, "length" if i == 1 else "stop")])
        return out

    def close(self):
        pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("sub"))["chat_model"]


def test_kept_rows_are_finished_answers_in_sft_shape(model_dir, tmp_path, monkeypatch):
    engines = []
    monkeypatch.setattr(
        answers, "get_engine", lambda model, backend, tokenizer: engines.append(FakeEngine(tokenizer)) or engines[-1]
    )
    cfg = AnswerDataConfig(
        model=model_dir,
        output_dir=str(tmp_path / "replay"),
        seed=3,
        sources=[{"id": "builtin:tasks", "template": "Q: {prompt}", "num": 5, "args": {"num": 40}}],
    )
    card = generate_answers(cfg)
    rows = [json.loads(line) for line in (tmp_path / "replay" / "train.jsonl").read_text().splitlines()]
    assert card["prompts"] == 5 and card["kept"] == 3 == len(rows)
    assert card["dropped"] == {"unfinished": 1, "empty": 1}
    prompts = prompts_of(cfg)
    assert [r["messages"][1]["content"] for r in rows] == [prompts[0], prompts[3], prompts[4]]
    assert all(p.startswith("Q: ") for p in prompts)
    assert rows[1]["messages"][0] == {"role": "system", "content": "/no_think"}
    assert rows[1]["messages"][2] == {"role": "assistant", "content": "answer number 3"}
    # the model answered the bare user turn, as in chat (no system flag in what it saw)
    tok = engines[0].tok
    assert "/no_think" not in tok.decode(engines[0].prompts[0]) and prompts[0] in tok.decode(engines[0].prompts[0])
    # the SFT reads the output as a source of `messages` rows
    assert load_source(str(tmp_path / "replay"), split="train").column_names == ["messages"]


def test_rows_with_an_empty_field_are_skipped(monkeypatch):
    import datasets

    rows = datasets.Dataset.from_list([{"title": "Rain in Spain"}, {"title": "  "}, {"title": "Rain in Spain"}])
    monkeypatch.setattr(answers, "load_source", lambda *a, **k: rows)
    cfg = AnswerDataConfig(model="m", sources=[{"id": "x", "template": "About: {title}"}])
    assert prompts_of(cfg) == ["About: Rain in Spain"]


def test_a_template_naming_a_missing_column_says_which():
    cfg = AnswerDataConfig(model="m", sources=[{"id": "builtin:tasks", "template": "{question}", "args": {"num": 4}}])
    with pytest.raises(ValueError, match="names column 'question'"):
        prompts_of(cfg)


def test_think_template_adds_a_think_row_per_training_answer_whose_block_closes_before_it(
    model_dir, tmp_path, monkeypatch
):

    monkeypatch.setattr(answers, "get_engine", lambda model, backend, tokenizer: FakeEngine(tokenizer))
    cfg = AnswerDataConfig(
        model=model_dir,
        output_dir=str(tmp_path / "replay"),
        seed=3,
        num_test=1,
        think_template="The user asks: {prompt}\nNo single right answer: I answer it plainly.",
        sources=[{"id": "builtin:tasks", "template": "Q: {prompt}", "num": 5, "args": {"num": 40}}],
    )
    card = generate_answers(cfg)
    rows = [json.loads(line) for line in (tmp_path / "replay" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (tmp_path / "replay" / "heldout.jsonl").read_text().splitlines()]
    plain, think = rows[:2], rows[2:]
    assert card["splits"] == {"train": 4, "heldout": 1} and len(think) == 2
    assert all(r["messages"][0]["content"] == "/no_think" for r in plain + held)  # the chat-loss set is unchanged
    for p, t in zip(plain, think):
        assert t["messages"][0] == {"role": "system", "content": "/think"} and t["messages"][1] == p["messages"][1]
        answer = t["messages"][2]["content"]
        assert answer == (
            f"<think>\nThe user asks: {p['messages'][1]['content']}\nNo single right answer: I answer "
            f"it plainly.\n</think>\n{p['messages'][2]['content']}"
        )
    with pytest.raises(ValueError, match="only field is"):
        AnswerDataConfig(model="m", think_template="About {title}")
