"""Running tool calls so that no tool can crash, hang or starve the run that called it.

- The builtin tools run here: `calculator` (bounded arithmetic, no eval), `search` (an offline table) and `python`,
  whose model-written program runs in the rewards sandbox (`rewards.sandbox.run_program`: no network, no host
  files, its own time and memory limits).
- User tools and environments run in a worker process (started with `spawn`: a fresh interpreter, not a copy of
  the trainer) under a time limit per call (`timeout_s`: past it the worker is killed and restarted) and an
  address-space limit (`memory_mb` above what the worker held after importing the tools: an allocation past it
  raises MemoryError there). A tool that raises, hangs, runs out of memory or kills its process becomes a tool
  message to the model with the reason, and is counted by status; the run goes on.
- An environment lives in the worker, one instance per rollout; when a worker is restarted its environments are
  made again from their rows (`reset`), and the rollouts that lost state are told so in the tool message.

Statuses: ok (the tool ran and gave something back), error (the tool's own verdict that the call failed:
`align.tools.ToolError`, with its `kind`; the `python` tool says so for an empty or comment-only program, a
syntax error, an exception, a non-zero exit, a CPU or wall-clock timeout, too much output and a program that
printed nothing), malformed (no parseable call), unknown_tool, bad_arguments, raised, timeout, memory, crashed;
the loop adds unanswered (a call in the last allowed turn, not run). A reply that is blank is an error too
(kind `empty_result`): only a call that gave the model something is ok. Whatever the status, the model is
shown a message, `Error: ...` for every status but ok.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import traceback
from dataclasses import dataclass
from typing import Any

from align.tools.functions import TOOLS, Tool, ToolError, check_arguments, environment_tools, load_tools, resolve
from align.tools.parse import ToolCall

STATUSES = (
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
)
BUILTIN_FUNCS = set(TOOLS.values())
MAX_RESULT_CHARS = 2000


@dataclass
class ToolResult:
    """What a call gave: the text the model is shown, its status (`STATUSES`) and, for `error`, the tool's kind."""

    name: str
    text: str
    status: str
    kind: str | None = None


def _vm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    return 0


def _worker_main(conn, tool_specs: list[str], env_spec: str | None, memory_mb: int) -> None:
    """The worker: resolve the tools, cap the address space, answer calls until told to stop."""
    funcs = {}
    for spec in tool_specs:
        func = resolve(spec)
        funcs[getattr(func, "__name__", spec)] = func
    env_class = resolve(env_spec, "environment") if env_spec else None
    envs: dict[str, Any] = {}
    limit = (_vm_kb() + memory_mb * 1024) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op, key, payload = msg
        try:
            if op == "stop":
                return
            if op == "reset":
                envs[key] = env_class()
                out = envs[key].reset(payload)
                conn.send(("ok", None if out is None else str(out)))
            elif op == "finish":
                env = envs.pop(key, None)
                reward = getattr(env, "reward", None)
                conn.send(("ok", float(reward()) if callable(reward) else None))
            else:  # call
                name, args = payload
                func = getattr(envs[key], name) if key in envs and name not in funcs else funcs[name]
                conn.send(("ok", str(func(**args))))
        except ToolError as e:  # the tool's own verdict: the call failed
            conn.send(("error", (e.kind, str(e))))
        except MemoryError:
            conn.send(("memory", f"the tool ran out of memory (limit {memory_mb} MB)"))
        except Exception as e:  # noqa: BLE001 - every tool failure is a message to the model
            tb = traceback.extract_tb(e.__traceback__)
            where = f" (line {tb[-1].lineno})" if tb else ""
            conn.send(("raised", f"{type(e).__name__}: {e}{where}"))


class ToolRunner:
    """Answers the calls of many rollouts (each a `key`): see the module docstring."""

    def __init__(
        self,
        tools: list[str] | dict[str, Tool] | None = None,
        environment: str | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
    ):
        self.tools = tools if isinstance(tools, dict) else load_tools(tools or [])
        self.env_spec = environment
        if environment:
            self.env_tools = environment_tools(resolve(environment, "environment"))
            clash = sorted(set(self.env_tools) & set(self.tools))
            if clash:
                raise ValueError(f"environment {environment!r} and the tools both define {clash}; rename one")
        else:
            self.env_tools = {}
        self.timeout_s, self.memory_mb = float(timeout_s), int(memory_mb)
        self._remote = [t.spec for t in self.tools.values() if t.func not in BUILTIN_FUNCS]
        self._proc = None
        self._conn = None
        self._rows: dict[str, dict] = {}  # live environments' rows: remade after a restart
        self._lost: set[str] = set()

    # -- the worker ---------------------------------------------------------------------------------------------

    @property
    def needs_worker(self) -> bool:
        return bool(self._remote or self.env_spec)

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_worker_main,
            args=(child, self._remote, self.env_spec, self.memory_mb),
            daemon=True,
            name="smolalign-tools",
        )
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(120) or parent.recv()[0] != "ready":
            self.close()
            raise RuntimeError("the tool worker did not start (see its traceback above)")

    def _restart(self) -> None:
        self._kill()
        self._start()
        for key, row in self._rows.items():  # environments are remade; their rollouts are told they lost state
            self._ask("reset", key, row)
            self._lost.add(key)

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def _ask(self, op: str, key: str, payload: Any) -> tuple[str, Any]:
        if self._proc is None:
            self._start()
        try:
            self._conn.send((op, key, payload))
            if not self._conn.poll(self.timeout_s):
                self._restart()
                return "timeout", f"the tool did not answer within {self.timeout_s:g} s and was stopped"
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            if self._proc is not None:
                self._proc.join(2)
            code = self._proc.exitcode if self._proc is not None else None
            self._restart()
            return "crashed", f"the tool's process died (exit code {code})"

    # -- rollouts -----------------------------------------------------------------------------------------------

    def start(self, key: str, row: dict | None) -> str | None:
        """A rollout begins: its environment is made and reset from the row (what reset returns is returned)."""
        if not self.env_spec:
            return None
        self._rows[key] = dict(row or {})
        status, out = self._ask("reset", key, self._rows[key])
        if status != "ok":
            raise RuntimeError(f"environment {self.env_spec} failed to reset: {out}")
        return out

    def finish(self, key: str) -> float | None:
        """A rollout ends: its environment's reward (None without one) and the environment is dropped."""
        if not self.env_spec or key not in self._rows:
            return None
        del self._rows[key]
        self._lost.discard(key)
        status, out = self._ask("finish", key, None)
        return out if status == "ok" else None

    def call(self, key: str, call: ToolCall) -> ToolResult:
        if call.error:
            return ToolResult(call.name or "?", f"Error: {call.error}", "malformed")
        tool = self.tools.get(call.name) or self.env_tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted({*self.tools, *self.env_tools}))
            return ToolResult(call.name, f"Error: unknown tool {call.name!r}; the tools are: {names}", "unknown_tool")
        problem = check_arguments(tool, call.arguments)
        if problem:
            return ToolResult(call.name, f"Error: {problem}", "bad_arguments")
        kind = None
        if call.name in self.tools and self.tools[call.name].func in BUILTIN_FUNCS:
            try:
                status, text = "ok", str(tool.func(**call.arguments))
            except ToolError as e:
                status, text, kind = "error", str(e), e.kind
            except Exception as e:  # noqa: BLE001
                status, text = "raised", f"{type(e).__name__}: {e}"
        else:
            status, text = self._ask("call", key, (call.name, call.arguments))
            if status == "error":
                kind, text = text
        if status == "ok" and not text.strip():
            status, text, kind = "error", "the tool returned nothing", "empty_result"
        if status != "ok":
            text = f"Error: {text}"
        if key in self._lost:
            self._lost.discard(key)
            text += "\n(Note: the environment was restarted after another tool failed; its state was reset.)"
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + " ...(cut)"
        return ToolResult(call.name, text, status, kind)

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("stop", "", None))
                self._proc.join(2)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
