"""A reward with variance in every group, whatever a micro model writes: a test that needs the policy to move (a
nonzero advantage) names it by path (`--reward_funcs [./tests/workers/varied_reward.py:text_hash_reward]`)."""

from __future__ import annotations

import zlib

from rewards import completion_text


def text_hash_reward(completions, **kwargs) -> list[float]:
    """A score in [0, 1) fixed by the completion's text: two different completions almost surely score apart."""
    return [zlib.crc32(completion_text(c).encode()) % 1000 / 1000 for c in completions]
