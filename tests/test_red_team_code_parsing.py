"""Red team against what the code and tool rewards read out of model output, parsing only (nothing runs in a sandbox
here): which fenced block is the solution, what a tool call is, and that each parser takes linear time and bounded
memory on 1 MB of adversarial input.

The rules each table pins (docs/rewards.md "The code sandbox", docs/tools.md "What a call is"):
- the solution is the fenced Python block that defines the entry point (or a name the tests take from the
  solution), else the only block, else the last one that defines something or reads input: never a usage example
  or a block of asserts after it; fences are CommonMark's (backticks or tildes, any line ends, a fence line inside
  a Python string is the string's);
- a tool call is a `<tool_call>` JSON block anywhere outside the think block, or a `<code>` block that stands on its
  own lines; everything else is text; an unclosed call that stands where a call would is malformed.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from align.tools.functions import MAX_CODE_CHARS, ToolError, python
from align.tools.parse import MAX_CALLS, ToolCall, parse_tool_calls
from rewards.code import (
    MAX_COMPLETION_CHARS,
    check_code_rows,
    code_reward,
    defined_names,
    extract_code,
    solution_names,
)
from rewards.fences import MAX_FENCES, fences

ADD = "def add(a, b):\n    return a + b\n"
F = "```"

# (id, completion, names the tests take from the solution, the code that must be extracted)
SOLUTION_BLOCK = [
    ("usage_example_after", f"{F}python\n{ADD}{F}\nUsage:\n{F}python\nprint(add(2, 3))\n{F}", ["add"], ADD),
    ("assert_block_after", f"{F}python\n{ADD}{F}\nTests:\n{F}python\nassert add(2, 3) == 5\n{F}", ["add"], ADD),
    ("usage_after_without_names", f"{F}python\n{ADD}{F}\n{F}python\nprint(add(2, 3))\n{F}", [], ADD),
    ("asserts_after_without_names", f"{F}python\n{ADD}{F}\n{F}python\nassert add(1, 1) == 2\n{F}", [], ADD),
    ("usage_before", f"{F}python\nprint(add(2, 3))\n{F}\nwith\n{F}python\n{ADD}{F}", ["add"], ADD),
    (
        "second_attempt_wins",
        f"{F}python\ndef add(a, b):\n    return a - b\n{F}\nFixed:\n{F}python\n{ADD}{F}",
        ["add"],
        ADD,
    ),
    ("defining_bare_block_beats_tagged_usage", f"{F}\n{ADD}{F}\n{F}python\nprint(add(1, 2))\n{F}", ["add"], ADD),
    (
        "output_block_after",
        f"{F}python\nprint(int(input()) * 2)\n{F}\nOutput:\n{F}\n4\n{F}",
        [],
        "print(int(input()) * 2)\n",
    ),
    (
        "input_and_output_blocks",
        f"{F}python\nn = int(input())\nprint(n + 1)\n{F}\nInput:\n{F}text\n1\n{F}\nOutput:\n{F}text\n2\n{F}",
        [],
        "n = int(input())\nprint(n + 1)\n",
    ),
    ("tilde_fence", f"~~~python\n{ADD}~~~\n", ["add"], ADD),
    ("crlf_line_ends", f"{F}python\r\n" + ADD.replace("\n", "\r\n") + f"{F}\r\n", ["add"], ADD),
    ("lone_cr_line_ends", f"{F}python\r" + ADD.replace("\n", "\r") + f"{F}\r", ["add"], ADD),
    (
        "fence_marker_in_a_string",
        f'{F}python\ndef wrap(s):\n    return "{F}" + s + "{F}"\n{F}',
        ["wrap"],
        f'def wrap(s):\n    return "{F}" + s + "{F}"\n',
    ),
    (
        "fence_line_in_a_docstring",
        f"{F}python\ndef f():\n    '''Example:\n    {F}\n    f()\n    {F}\n    '''\n    return 1\n{F}",
        ["f"],
        f"def f():\n    '''Example:\n    {F}\n    f()\n    {F}\n    '''\n    return 1\n",
    ),
    (
        "escaped_quote_in_a_docstring",
        f'{F}python\ndef f():\n    """a \\""" b\n{F}\n"""\n    return 1\n{F}',
        ["f"],
        f'def f():\n    """a \\""" b\n{F}\n"""\n    return 1\n',
    ),
    ("longer_fence_holds_a_shorter_one", f"````python\n{ADD}# {F}\n{F}\n````", ["add"], f"{ADD}# {F}\n{F}\n"),
    (
        "fence_in_a_list_item",
        f"1. The code:\n   {F}python\n   def add(a, b):\n       return a + b\n   {F}",
        ["add"],
        ADD,
    ),
    ("python3_and_py_tags", f"{F}py\nx = 1\n{F}\n{F}Python3\n{ADD}{F}", ["add"], ADD),
    ("info_string_with_attributes", f"{F}python title=solution.py\n{ADD}{F}", ["add"], ADD),
    ("unclosed_fence_at_the_end", f"{F}python\n{ADD}", ["add"], ADD),
    ("tagged_block_beats_bare_output", f"{F}python\n{ADD}{F}\n{F}\n5\n{F}", [], ADD),
    (
        "class_defines_the_entry_point",
        f"{F}python\nclass Stack:\n    pass\n{F}\n{F}python\nStack()\n{F}",
        ["Stack"],
        "class Stack:\n    pass\n",
    ),
    ("no_fence_at_all", ADD, ["add"], ADD.strip()),
    (
        "think_block_left_out",
        f"<think>\n{F}python\ndef add(a, b):\n    return 0\n{F}\n</think>\n{F}python\n{ADD}{F}",
        ["add"],
        ADD,
    ),
]

# (id, completion, names, what is extracted): the answer holds no Python block the tests could take
NO_SOLUTION = [
    ("only_inside_think", f"<think>\n{F}python\n{ADD}{F}\n</think>\nno code", ["add"], "no code"),
    ("unclosed_think_is_all_reasoning", f"{F}python\n{ADD}{F}\n<think>\nmore", ["add"], ""),
    (
        "another_language",
        f"{F}javascript\nfunction add(a, b) {{ return a + b }}\n{F}",
        ["add"],
        f"{F}javascript\nfunction add(a, b) {{ return a + b }}\n{F}",
    ),
    (
        "definition_in_prose_only",
        "def add(a, b): is what you need, then\n" + f"{F}python\nprint(add(1, 2))\n{F}",
        ["add"],
        "print(add(1, 2))\n",
    ),
]


@pytest.mark.parametrize("case", SOLUTION_BLOCK, ids=[c[0] for c in SOLUTION_BLOCK])
def test_the_solution_is_the_block_that_defines_it(case):
    _, completion, names, code = case
    assert extract_code(completion, names) == code


@pytest.mark.parametrize("case", NO_SOLUTION, ids=[c[0] for c in NO_SOLUTION])
def test_an_answer_without_the_solution_block_gives_no_solution(case):
    _, completion, names, code = case
    assert extract_code(completion, names) == code


def test_fences_follow_commonmark():
    found = fences(f"{F}python\na\n{F}\n~~~\nb\n~~~~\n{F}x{F}\n    {F} sh\nc\n {F}\n{F}\nopen")
    assert found == [("python", "a\n", True), ("", "b\n", True), ("sh", "c\n", True), ("", "open\n", False)]
    assert fences(f"{F}\n~~~\n{F}") == [("", "~~~\n", True)]  # a tilde line does not close a backtick fence
    assert fences(f"````\n{F}\n````") == [("", f"{F}\n", True)]  # nor a shorter run
    assert fences(f"{F}\nx\n{F} not a close\n{F}") == [("", f"x\n{F} not a close\n", True)]


def test_unbalanced_quotes_fall_back_to_the_first_closing_line():
    text = f"{F}python\ns = '''\n{F}\nprose\n{F}python\nx = 1\n{F}"
    assert fences(text) == [("python", "s = '''\n", True), ("python", "x = 1\n", True)]


def test_defined_names_and_the_names_the_tests_take():
    assert defined_names("def a():\n  b = 1\nasync def c(): pass\nclass D: pass\ne = f = 3\ng == h\n") == {
        "a",
        "c",
        "D",
        "e",
    }
    assert solution_names("assert check(4) == True") == {"check"}  # MBPP's function named check
    assert solution_names("assert max_of([1, 2]) == max([1, 2])") == {"max_of"}
    assert solution_names("assert max([1, 5]) == 5") == {"max"}  # the only name: a function that shadows max
    assert solution_names("def check(candidate):\n    assert candidate(1)\n", "f") == {"f"}
    assert solution_names("assert (") == frozenset()


def test_a_completion_over_the_cap_scores_zero_without_running():
    over = f"{F}python\n{ADD}{F}" + " " * MAX_COMPLETION_CHARS
    assert code_reward([over], tests=["assert add(1, 2) == 3"]) == [0.0]


# ------------------------------------------------------------------------------------------- what a tool call is

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
CALL = ToolCall("calculator", {"expression": "2+2"})
PY = ToolCall("python", {"code": "print(1)"})

# (id, turn, the calls it makes): prose is never a call
CALLS = [
    ("code_block_alone", "<code>print(1)</code>", [PY]),
    ("code_block_on_its_own_lines", "Let me count.\n<code>\nprint(1)\n</code>\n", [PY]),
    ("code_block_indented", "  <code>print(1)</code>  ", [PY]),
    ("code_after_a_tool_call", CALC + "<code>print(1)</code>", [CALL, PY]),
    ("code_then_tool_call_on_one_line", "<code>print(1)</code> " + CALC, [PY, CALL]),
    ("tool_call_in_a_sentence", f"I will call {CALC} now.", [CALL]),
    ("tool_call_after_think", f"<think>\nplan {CALC}\n</think>\n{CALC}", [CALL]),
    ("crlf_line_ends", "Let me count.\r\n<code>\r\nprint(1)\r\n</code>\r\nThen " + CALC + "\r\n", [PY, CALL]),
    (
        "code_block_holding_a_fence",
        "<code>\n```python\nprint(1)\n```\n</code>",
        [ToolCall("python", {"code": "print(1)"})],
    ),
    ("tool_call_holding_a_json_fence", "<tool_call>\n```json\n" + CALC[11:-12] + "\n```\n</tool_call>", [CALL]),
    (
        "code_with_a_fence_and_more_is_as_written",
        "<code>\n```\nx\n```\nprint(2)\n</code>",
        [ToolCall("python", {"code": "```\nx\n```\nprint(2)"})],
    ),
    ("inline_code_in_prose", "Use <code>len(s)</code> to count.", []),
    ("inline_code_at_line_start_then_prose", "<code>len(s)</code> counts the letters.", []),
    ("inline_code_after_words", "The call is <code>print(1)</code>", []),
    ("inline_code_then_a_real_block", "Use <code>len</code>:\n<code>print(1)</code>", [PY]),
    ("unclosed_inline_code_is_text", "see <code>x and more", []),
    ("html_code_span_in_a_list", "- <b>tip</b>: <code>x = 1</code> sets x", []),
    ("calls_in_think_are_reasoning", f"<think>\n{CALC}\n<code>print(1)</code>\n</think>\nThe answer is 4.", []),
    ("unclosed_think_is_reasoning", f"<think>\n{CALC}", []),
]
# (id, turn, error substring): a call that stands where a call would but is broken
MALFORMED = [
    ("unclosed_code_block", "<code>print(1)", "opened and not closed"),
    ("unclosed_tool_call", '<tool_call>{"name": "calculator"', "opened and not closed"),
    ("tool_call_not_json", "<tool_call>{name: calculator}</tool_call>", "not valid JSON"),
    ("tool_call_without_a_name", '<tool_call>["calculator"]</tool_call>', '{"name"'),
    (
        "tool_call_arguments_not_an_object",
        '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
        "must be a JSON object",
    ),
    ("empty_tool_call", "<tool_call></tool_call>", "not valid JSON"),
    ("deeply_nested_json", "<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
]


@pytest.mark.parametrize("case", CALLS, ids=[c[0] for c in CALLS])
def test_what_a_call_is(case):
    _, turn, calls = case
    assert parse_tool_calls(turn, python_tool=True) == calls


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_a_broken_call_is_malformed(case):
    _, turn, error = case
    (call,) = parse_tool_calls(turn, python_tool=True)
    assert call.error is not None and error in call.error


def test_code_is_text_without_the_python_tool_and_calls_per_turn_are_capped():
    assert parse_tool_calls("<code>print(1)</code>") == []
    calls = parse_tool_calls((CALC + "\n") * (MAX_CALLS + 5))
    assert len(calls) == MAX_CALLS + 1 and calls[-1].error.startswith(f"more than {MAX_CALLS} calls")


# (code, kind): the python tool's own verdict before anything runs
EMPTY_OR_BROKEN = [
    ("", "empty"),
    ("  \n\t", "empty"),
    ("# only a comment\n", "empty"),
    ("def f(:\n", "syntax_error"),
    ("x = 1\x00", "syntax_error"),
    ("(" * 300, "syntax_error"),
    ("x" * (MAX_CODE_CHARS + 1), "too_long"),
]


@pytest.mark.parametrize("code, kind", EMPTY_OR_BROKEN, ids=[k + str(i) for i, (_, k) in enumerate(EMPTY_OR_BROKEN)])
def test_an_empty_or_broken_program_is_a_failed_call_before_it_runs(code, kind):
    with pytest.raises(ToolError) as e:
        python(code)
    assert e.value.kind == kind


# ------------------------------------------------------------------------------------------- load-time refusal

HUMAN_EVAL_TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


@pytest.mark.parametrize(
    "row, refused",
    [
        ({"reward": "code_reward", "tests": HUMAN_EVAL_TESTS}, "column is missing"),
        (
            {"reward": "code_reward", "tests": HUMAN_EVAL_TESTS, "entry_point": " ", "task_id": "t/1"},
            "(task_id 't/1')",
        ),
        ({"tests": HUMAN_EVAL_TESTS, "entry_point": None}, "column is empty"),  # no reward column: the default's
        ({"reward": "code_reward", "tests": HUMAN_EVAL_TESTS, "entry_point": "add"}, None),
        ({"reward": "code_reward", "tests": HUMAN_EVAL_TESTS + "check(add)\n"}, None),
        ({"reward": "code_reward", "tests": ["assert add(2, 3) == 5"]}, None),
        ({"reward": "code_reward", "tests": [{"input": "1", "output": "1"}]}, None),
        ({"reward": "math_reward", "tests": HUMAN_EVAL_TESTS}, None),
    ],
)
def test_a_code_row_without_an_entry_point_is_refused_at_load(row, refused):
    rows = [{"reward": "code_reward", "tests": "assert f() == 1", "entry_point": "f"}, row]
    if refused is None:
        check_code_rows(rows, "code_reward")
        return
    with pytest.raises(ValueError) as e:
        check_code_rows(rows, "code_reward", "the GRPO dataset")
    assert str(e.value).startswith("the GRPO dataset, row 1") and refused in str(e.value)
    assert "'entry_point'" in str(e.value)


def test_grpo_and_scoring_loaders_refuse_such_a_row():
    import datasets

    from align.eval.generation import generate_and_score
    from align.grpo.prompts import prepare_prompts

    rows = [{"prompt": "Write add.", "tests": HUMAN_EVAL_TESTS, "entry_point": "", "reward": "code_reward"}]
    with pytest.raises(ValueError, match="the GRPO dataset, row 0: its 'tests' define check"):
        prepare_prompts(datasets.Dataset.from_list(rows))
    with pytest.raises(ValueError, match="the scored rows, row 0"):
        generate_and_score(lambda ids, p: [], rows, [[1]], None, str)
    fixed = prepare_prompts(datasets.Dataset.from_list([{**rows[0], "entry_point": "add"}]))
    assert fixed[0]["entry_point"] == "add"


# ------------------------------------------------------------------------------------------- linear time, bounded

MB = 1 << 20
SHAPES = {
    "fence_then_whitespace": F + " " * MB,
    "tagged_fence_then_whitespace": F + "python" + " \t" * (MB // 2),
    "fence_then_newlines": F + "python\n" + "\n" * MB,
    "fence_then_spaces_line": F + "python\n" + " " * MB,
    "many_fences": (F + "\n") * (MB // 4),
    "many_python_fences": (F + "python\nx = 1\n" + F + "\n") * (MB // 22),
    "unbalanced_triple_quotes": F + "python\n" + ("'''\n" + F + "\n") * (MB // 8),
    "triple_quotes_on_one_line": F + "python\n" + '"""' * (MB // 3) + "\n" + F,
    "backslashes": F + "python\n" + "\\" * MB + "\n" + F,
    "single_quotes": F + "python\n" + "'a" * (MB // 2) + "\n" + F,
    "comments": F + "python\n" + "#'''\n" * (MB // 5) + F,
    "inline_triple_backticks": (F + "x" + F) * (MB // 7),
    "one_huge_fence_run": "`" * MB,
    "indented_openers": ("   ````x\n") * (MB // 9),
    "carriage_returns": (F + "\r") * (MB // 4),
    "long_identifier_line": F + "python\n" + "a" * MB + "\n" + F,
    "annotation_without_value": F + "python\na:" + " " * MB + "\n" + F,
    "many_defs": F + "python\n" + "def f():\n" * (MB // 9) + F,
    "unclosed_think_tags": "<think>" * (MB // 7),
    "code_openings": "<code>" * (MB // 6),
    "code_openings_on_lines": "<code>\n" * (MB // 7),
    "code_openings_then_far_close_in_prose": "<code>\n" * (MB // 8) + "</code> prose",
    "tool_call_openings": "<tool_call>" * (MB // 11),
    "tool_call_closings": "</tool_call>" * (MB // 12),
    "code_then_whitespace": "<code>" + " " * MB,
    "inline_code_pairs": "a <code>x</code> " * (MB // 17),
    "nested_json_in_a_call": "<tool_call>" + "[" * (MB // 2) + "</tool_call>",
    "whitespace_then_a_call": " " * MB + CALC,
}
PARSERS = {
    "fences": fences,
    "extract_code": lambda t: extract_code(t, ["f", "add"]),
    "parse_tool_calls": lambda t: parse_tool_calls(t, python_tool=True),
}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_parsers_take_linear_time_and_bounded_memory_on_1mb(parser, shape):
    text, parse = SHAPES[shape], PARSERS[parser]
    start = time.perf_counter()
    parse(text)
    assert time.perf_counter() - start < 2.0
    tracemalloc.start()
    try:
        parse(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * MB


def test_fences_beyond_the_cap_are_not_read():
    assert len(fences((F + "\nx\n" + F + "\n") * (MAX_FENCES + 10))) == MAX_FENCES
