"""Property-based fuzzing (Hypothesis) of what the code and tool rewards read out of model output: on any text built
from the characters their parsers care about (fence runs, quotes, backslashes, tags, line ends), each returns its
type within its bounds and within a time limit, and never raises. The sandbox is stubbed out: nothing runs.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from align.tools.parse import MAX_CALLS, ToolCall, parse_tool_calls  # noqa: E402
from rewards.code import code_reward, extract_code  # noqa: E402
from rewards.fences import fences  # noqa: E402
from rewards.tools import tool_call_reward  # noqa: E402

PIECES = [
    "```",
    "~~~",
    "````",
    "```python",
    "```py",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "'",
    '"',
    "'''",
    '"""',
    "\\",
    "#",
    "def f():",
    "def add(a, b):",
    "    return 1",
    "x = 1",
    "print(f())",
    "assert f() == 1",
    "<think>",
    "</think>",
    "<code>",
    "</code>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "python", "arguments": ',
    '{"code": "print(1)"}}',
    "[",
    "{",
    "}",
    "a",
    "é",
    "\x00",
]
TEXT = st.lists(st.sampled_from(PIECES) | st.text(max_size=5), max_size=200).map("".join)
FUZZ = settings(max_examples=150, deadline=2000)


@FUZZ
@given(TEXT, st.lists(st.sampled_from(["f", "add", "check", "max"]), max_size=2))
def test_extract_code_and_fences_return_text_within_the_input(text, names):
    code = extract_code(text, names)
    assert isinstance(code, str) and len(code) <= len(text) + 1
    for block in fences(text):
        assert isinstance(block.lang, str) and isinstance(block.body, str) and len(block.body) <= len(text) + 1


@FUZZ
@given(TEXT, st.booleans())
def test_parse_tool_calls_returns_calls_or_malformed_ones(text, python_tool):
    calls = parse_tool_calls(text, python_tool=python_tool)
    assert len(calls) <= MAX_CALLS + 1
    for call in calls:
        assert isinstance(call, ToolCall) and isinstance(call.name, str) and isinstance(call.arguments, dict)
        assert call.error is None or isinstance(call.error, str)


STATUS = st.sampled_from(
    [
        "ok",
        "error",
        "malformed",
        "unknown_tool",
        "bad_arguments",
        "raised",
        "timeout",
        "memory",
        "crashed",
        "unanswered",
        "",
        "OK",
    ]
)


@FUZZ
@given(st.lists(st.none() | st.lists(st.fixed_dictionaries({"status": STATUS}), max_size=20), max_size=8))
def test_tool_call_reward_is_a_bounded_mean_or_none(rollouts):
    scores = tool_call_reward([None] * len(rollouts), tool_calls=rollouts)
    for calls, s in zip(rollouts, scores):
        if calls is None:
            assert s is None
        else:
            assert -1.0 <= s <= 1.0
            assert s == (sum(c["status"] == "ok" for c in calls) * 2 - len(calls)) / len(calls) if calls else s == 0.0


@FUZZ
@given(
    TEXT,
    st.sampled_from(
        [
            "assert f() == 1",
            "def check(candidate):\n    assert candidate() == 1\n",
            "x = 1",
            '[{"input": "1", "output": "1"}]',
            None,
            "assert (",
            ["assert add(1, 2) == 3"],
        ]
    ),
    st.sampled_from([None, "", "f", "add"]),
)
def test_code_reward_returns_a_score_or_abstains(text, tests, entry_point):
    import warnings
    from unittest import mock

    class Passed:
        passed = True

    seen = []
    with (
        mock.patch("rewards.code.execute", lambda c, *a, **k: seen.append(c) or Passed()),
        mock.patch("rewards.code.passes_io", lambda c, *a, **k: seen.append(c) or True),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        (score,) = code_reward([text], tests=[tests], entry_point=entry_point, num_workers=1)
    assert score in (None, 0.0, 1.0)
    assert all(isinstance(c, str) and len(c) <= len(text) + 1 for c in seen)
