"""Multi-turn tool use: typed tools and environments (functions.py), call parsing (parse.py), contained execution
(runner.py) and the turn loop above the rollout engine (loop.py). GRPO, on-policy distillation, evaluation and
data generation all roll out through `ToolLoop`; docs/tools.md shows how to add a tool and an environment."""

from align.tools.functions import TOOLS, Environment, Tool, ToolError, check_arguments, environment_tools, load_tools
from align.tools.loop import ToolLoop, Trajectory, with_tools
from align.tools.parse import ToolCall, call_text, parse_tool_calls, tools_system_text
from align.tools.runner import STATUSES, ToolResult, ToolRunner

__all__ = [
    "STATUSES",
    "TOOLS",
    "Environment",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolLoop",
    "ToolResult",
    "ToolRunner",
    "Trajectory",
    "call_text",
    "check_arguments",
    "environment_tools",
    "load_tools",
    "parse_tool_calls",
    "tools_system_text",
    "with_tools",
]
