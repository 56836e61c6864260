"""A sandbox for untrusted Python: run a program with no network, no host files, no secrets, bounded resources.

Why: code rewards execute whatever the policy writes. A reward must survive infinite loops, fork bombs,
memory hogs, floods of output, attempts to read secrets, write or delete files, or reach the network —
and the trainer beside it must not notice.

How (Linux namespaces, no extra package; FACTS.md "Sandboxing untrusted code"):
- ``unshare --mount --net --pid --ipc --uts --fork --kill-child`` (plus ``--user --map-root-user`` when
  not running as root): no network (an empty network namespace), its own process tree.
- Inside, a small bootstrap (``rewards.bootstrap``) builds a new root on a size-limited tmpfs — read-only,
  nosuid binds of /usr, /lib*, /bin and the Python installation; /dev/null, /dev/zero, /dev/random,
  /dev/urandom; /dev/stdin, /dev/stdout, /dev/stderr and /dev/fd as links to ``/proc/self/fd``; a private,
  size-limited ``/dev/shm`` (multiprocessing's semaphores and shared memory); the sandbox's own ``/proc``, which
  lists only its own processes (others' uids hidden); a private ``/tmp`` and a throwaway working directory
  ``/work`` — then ``pivot_root``s into it and detaches the old root: the host's files (the project, ``/tmp``,
  the host's ``/proc`` and with it the parent's environment) are not reachable at all.
- The candidate then runs as an unprivileged uid chosen at random for this run (as root), or with its
  namespace capabilities shed (as a user), with ``no_new_privs``, an empty environment and rlimits on
  CPU seconds, address space, processes, file size and open files.
- Memory is bounded as a whole where the kernel allows (``rewards.limits``: the limits, a memory cgroup per
  sandbox joined by the bootstrap before anything else runs, a seccomp filter against ``memfd_create`` and SysV
  memory, the IPC namespace's SysV limits; ``memory_peak_mb`` reports the cgroup's peak).
- The parent kills the whole process group at the wall-clock limit or when stdout/stderr exceed their
  cap; the end of the pid namespace's first process takes every process the candidate started with it.
- The candidate runs ``python -I -S``: Python's standard library only (no site-packages, no user paths).
- ``spawn`` passes a sandbox only the pipes it is given (``pass_fds``); ``rewards.judge`` runs a candidate and
  its tests in two sandboxes joined by such pipes, so that no verdict ever comes from the candidate's process.
  ``run_program`` runs one program as ``__main__`` with a given stdin (a file, as a judge's input is: fd 0,
  ``input()``, ``sys.stdin.buffer``, ``open(0)``, ``/dev/stdin`` all read it and ``os.fstat(0).st_size`` is its
  size) and ``exit()``/``quit()`` defined, and reports its exit status and output.

Without ``unshare`` (or where namespaces are forbidden) ``isolation="auto"`` warns once and runs with the
rlimits, the empty environment, the throwaway directory and the uid drop only: no filesystem or network
isolation. ``isolation="namespace"`` refuses instead.

Try it: ``python -c "from rewards.sandbox import run_program; print(run_program('while True: pass'))"``
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

from rewards.bootstrap import BOOTSTRAP, PROGRAM
from rewards.limits import SandboxLimits, bootstrap_limits, cgroup_peak, make_cgroup, remove_cgroup


def _program_payload(code: str, stdin: str) -> bytes:
    """What ``PROGRAM`` reads on its fd 0: the spec's length (16 digits), the spec, then the input itself."""
    spec = json.dumps({"code": code}).encode()
    return b"%016d" % len(spec) + spec + stdin.encode("utf-8", "surrogateescape")


@dataclass
class SandboxResult:
    """What one sandboxed program did. ``passed``: it ran to the end with exit status 0, in time, within its
    output caps (for a program, not a verdict on any tests: see ``rewards.judge``)."""

    passed: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False
    isolated: bool = False
    uid: int | None = field(default=None, repr=False)  # the throwaway uid it ran as (root only)
    memory_peak_mb: float | None = None  # the most memory its cgroup held at once (None without a memory cgroup)


def _python() -> str:
    return os.path.realpath(sys.executable)


def _binds() -> list[str]:
    paths = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin"]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    return paths


def _unshare_cmd() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    cmd = [exe, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--user", "--map-root-user"]
    return cmd


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int, timeout_s: float = 5.0) -> None:
    """Kill every process of the sandbox's throwaway uid and wait until none is left. A pid namespace dies
    with its first process, but asynchronously; without one, processes that left the group survive it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            if str(uid) in uids:
                found = True
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _usable_by_others(path: str) -> bool:
    """True when a process of another uid can run ``path`` (every directory on the way is world-searchable)."""
    st = os.stat(path)
    if not st.st_mode & stat.S_IXOTH:
        return False
    d = os.path.dirname(path)
    while True:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
        if d == "/":
            return True
        d = os.path.dirname(d)


@dataclass
class Sandboxed:
    """One running sandboxed process: ``python -I -S -c harness`` fed ``payload`` on stdin."""

    proc: subprocess.Popen
    payload: bytes
    isolated: bool
    uid: int | None
    workdir: str | None
    cgroup: str | None = None
    memory_peak_mb: float | None = None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    returncode: int | None = None


def spawn(
    harness: str,
    payload: bytes,
    limits: SandboxLimits,
    isolate: bool,
    pass_fds: tuple[int, ...] = (),
    avoid_uids: tuple[int | None, ...] = (),
) -> Sandboxed:
    """Start ``harness`` in a fresh sandbox (its own namespaces, root, uid and process group); the open file
    descriptors ``pass_fds`` are the only ones it inherits besides stdin/stdout/stderr."""
    uid = None
    if os.geteuid() == 0:
        while uid is None or uid in avoid_uids:  # processes of different runs never share a uid
            uid = 0x30000 + secrets.randbelow(0x10000)
    if not isolate and uid is not None and not _usable_by_others(_python()):
        uid = None  # the interpreter sits under a private directory (e.g. /root/.pyenv): stay root, warned
    workdir = None if isolate else tempfile.mkdtemp(prefix="smolalign-sandbox-")
    if workdir is not None and uid is not None:
        os.chown(workdir, uid, uid)
    cgroup = make_cgroup(limits)
    cfg = {
        "isolate": isolate,
        "binds": _binds(),
        "tmpfs_mb": limits.tmpfs_mb,
        "uid": uid,
        "workdir": workdir,
        "python": _python(),
        "harness": harness,
        "pass_fds": list(pass_fds),
        "cgroup": cgroup,
        **bootstrap_limits(limits),  # "rlimits", "ipc", "deny"
    }
    cmd = [_python(), "-I", "-S", "-c", BOOTSTRAP, json.dumps(cfg)]
    if isolate:
        cmd = [*_unshare_cmd(), "--", *cmd]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},  # no parent secrets, ever
            cwd=workdir or "/",
            start_new_session=True,  # its own process group, killed as one
            close_fds=True,
            pass_fds=pass_fds,
        )
    except BaseException:
        if cgroup is not None:
            remove_cgroup(cgroup)
        raise
    return Sandboxed(proc, payload, isolate, uid, workdir, cgroup)


def supervise(
    boxes: list[Sandboxed],
    limits: SandboxLimits,
    extra: dict[int, bytearray] | None = None,
    done_fds: set[int] | None = None,
    deadline: float | None = None,
) -> tuple[bool, bool]:
    """Feed each sandbox its payload and read its capped stdout/stderr (and the ``extra`` read fds) until
    every fd of ``done_fds`` (default: all) is at EOF, the deadline passes or a stream overflows its cap;
    return (timed_out, truncated). Selectors instead of threads, so it works from any thread of the caller."""
    deadline = time.monotonic() + limits.wall_s if deadline is None else deadline
    bufs: dict[int, bytearray] = dict(extra or {})
    writes: dict[int, memoryview] = {}
    with selectors.DefaultSelector() as sel:
        for box in boxes:
            for stream, buf in ((box.proc.stdout, box.out), (box.proc.stderr, box.err)):
                if stream is not None and not stream.closed:
                    bufs[stream.fileno()] = buf
            stdin = box.proc.stdin
            if stdin is not None and not stdin.closed:
                os.set_blocking(stdin.fileno(), False)
                writes[stdin.fileno()] = memoryview(box.payload)
                sel.register(stdin.fileno(), selectors.EVENT_WRITE, stdin)
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        waiting = set(bufs) if done_fds is None else set(done_fds) & set(bufs)
        timed_out = truncated = False
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                fd = key.fd
                if fd in writes:
                    try:
                        writes[fd] = writes[fd][os.write(fd, writes[fd][:65536]) :]
                    except BrokenPipeError:
                        writes[fd] = writes[fd][:0]
                    if not writes[fd]:
                        sel.unregister(fd)
                        key.data.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    waiting.discard(fd)
                    continue
                bufs[fd] += chunk
                if len(bufs[fd]) > limits.output_bytes:
                    truncated = True
                    del bufs[fd][limits.output_bytes :]
            if truncated:
                break
    return timed_out, truncated


def reap(box: Sandboxed, timeout_s: float = 5.0) -> int | None:
    """Kill the sandbox's process group (and its uid), wait for it, clean up; return its exit status."""
    _kill_group(box.proc)
    try:
        box.returncode = box.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        box.returncode = None
    for stream in (box.proc.stdin, box.proc.stdout, box.proc.stderr):
        if stream and not stream.closed:
            stream.close()
    if box.uid is not None:
        _kill_uid(box.uid)
    if box.workdir is not None:
        shutil.rmtree(box.workdir, ignore_errors=True)
    if box.cgroup is not None:
        box.memory_peak_mb = cgroup_peak(box.cgroup)
        remove_cgroup(box.cgroup)
    return box.returncode


def wait_exit(box: Sandboxed, deadline: float) -> tuple[int | None, bool]:
    """Wait for the sandbox to exit by ``deadline``; return (exit status, timed_out)."""
    try:
        return box.proc.wait(timeout=max(0.05, deadline - time.monotonic())), False
    except subprocess.TimeoutExpired:
        return None, True


def _run_program(code: str, stdin: str, limits: SandboxLimits, isolate: bool) -> SandboxResult:
    box = spawn(PROGRAM, _program_payload(code, stdin), limits, isolate)
    try:
        deadline = time.monotonic() + limits.wall_s
        timed_out, truncated = supervise([box], limits, deadline=deadline)
        returncode = None
        if not (timed_out or truncated):
            returncode, timed_out = wait_exit(box, deadline)
    finally:
        status = reap(box)
    returncode = status if returncode is None else returncode
    return SandboxResult(
        passed=returncode == 0 and not timed_out and not truncated,
        returncode=returncode,
        stdout=box.out.decode("utf-8", "replace"),
        stderr=box.err.decode("utf-8", "replace"),
        timed_out=timed_out,
        output_truncated=truncated,
        isolated=isolate,
        uid=box.uid,
        memory_peak_mb=box.memory_peak_mb,
    )


@lru_cache(maxsize=1)
def namespaces_available() -> tuple[bool, str]:
    """(True, "") when the namespace sandbox works on this machine, else (False, why). Probed once."""
    if sys.platform != "linux":
        return False, f"namespaces need Linux, this is {sys.platform}"
    if _unshare_cmd() is None:
        return False, "the 'unshare' command (util-linux) is not installed"
    try:
        res = _run_program("pass", "", SandboxLimits(wall_s=30), isolate=True)
    except OSError as e:
        return False, str(e)
    if not res.passed:
        return False, (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
    return True, ""


@lru_cache(maxsize=1)
def _warn_unisolated(reason: str) -> None:
    warnings.warn(
        f"code sandbox: Linux namespaces are unavailable ({reason}); running candidate code WITHOUT filesystem "
        "and network isolation (rlimits, empty environment, throwaway directory, and a uid drop where possible). "
        "Install util-linux's unshare / allow user namespaces, or pass isolation='namespace' to refuse instead.",
        RuntimeWarning,
        stacklevel=5,
    )


def use_namespaces(isolation: str) -> bool:
    """Resolve ``isolation`` ("auto", "namespace", "none") to whether this run gets namespaces."""
    if isolation not in ("auto", "namespace", "none"):
        raise ValueError(f"isolation must be 'auto', 'namespace' or 'none', got {isolation!r}")
    if isolation == "none":
        return False
    available, reason = namespaces_available()
    if available:
        return True
    if isolation == "namespace":
        raise RuntimeError(f"code sandbox: isolation='namespace' but namespaces are unavailable: {reason}")
    _warn_unisolated(reason)
    return False


def run_program(
    code: str, stdin: str = "", limits: SandboxLimits | None = None, isolation: str = "auto"
) -> SandboxResult:
    """Run ``code`` as a program (``__name__ == "__main__"``, ``stdin`` on its standard input) in the sandbox.

    >>> run_program("print(int(input()) + 1)", stdin="41\\n").stdout
    '42\\n'
    >>> r = run_program("while True: pass", limits=SandboxLimits(wall_s=1, cpu_s=1))
    >>> r.passed
    False
    """
    isolate = use_namespaces(isolation)
    return _run_program(code, stdin, limits or SandboxLimits(), isolate)
