"""Per-call reward terms for tool-use rollouts (align.tools): they read the columns the tool loop adds to each
completion's row, so the accuracy verifier stays on the final answer and these stay optional.

- ``tool_call_reward``: the mean over a rollout's calls of +1 for a call that ran and gave something back (status
  ok) and -1 for every other: a failed call by the tool's own verdict (status error: an empty program, a syntax
  error, an exception, a non-zero exit, a timeout, a program that printed nothing, a search without a match), a
  malformed one, an unknown tool, wrong arguments, one that raised, timed out, ran out of memory, or was made in the
  last allowed turn where its answer is never read; 0 for a rollout without calls, None for a row without a tool
  loop (abstain). Statuses come from the tools (``align.tools.runner``), never from their replies' text, and only
  calls the parser accepts are counted (``align.tools.parse``: prose is never a call), so an empty call cannot lift
  a rollout whose real call failed.
- ``environment_reward``: the environment's own ``reward()`` at the end of the rollout (None without one).
"""

from __future__ import annotations

from typing import Any


def tool_call_reward(completions: list, tool_calls: list | None = None, **kwargs: Any) -> list[float | None]:
    """+1 per call that ran, -1 per failed or wasted one, averaged over the rollout's calls; 0 without calls.

    >>> tool_call_reward(["a", "b", "c"], tool_calls=[[{"status": "ok"}, {"status": "malformed"}], [], None])
    [0.0, 0.0, None]
    >>> tool_call_reward(["a"], tool_calls=[[{"status": "malformed"}, {"status": "error"}]])  # an empty call after it
    [-1.0]
    >>> tool_call_reward(["a"], tool_calls=[[{"status": "ok"}]])
    [1.0]
    """
    if tool_calls is None:
        return [None] * len(completions)
    out: list[float | None] = []
    for calls in tool_calls:
        if calls is None:
            out.append(None)
        elif not calls:
            out.append(0.0)
        else:
            out.append(sum(1.0 if c.get("status") == "ok" else -1.0 for c in calls) / len(calls))
    return out


def environment_reward(completions: list, env_reward: list | None = None, **kwargs: Any) -> list[float | None]:
    """The environment's own reward() at the end of each rollout (None where it has none).

    >>> environment_reward(["a", "b"], env_reward=[1, None])
    [1.0, None]
    """
    if env_reward is None:
        return [None] * len(completions)
    return [None if r is None else float(r) for r in env_reward]
