"""How a sandbox's resources are bounded beyond the plain rlimits: the limits themselves, memory cgroups, a seccomp
filter, and the SysV / POSIX message-queue limits.

Why a module of its own: ``rewards.sandbox`` builds the isolated root and runs programs; what bounds the memory
of a whole sandbox (not only of each process) is a separate job with its own kernel interfaces (cgroup v1/v2
files, classic BPF, ``/proc/sys/kernel``), probed and tested on their own (``tests/test_red_team_code.py``).

- ``SandboxLimits``: the limits of one run; ``rlimits`` turns them into the rlimits every process gets (with
  ``RLIMIT_MSGQUEUE`` 0: POSIX message queues outlive the process), ``ipc_limits`` into the sandbox's own IPC
  namespace's SysV limits (at most ``memory_mb`` of shared memory, a few small queues).
- Memory cgroups: where this process may make them (v1's memory hierarchy, or v2 with the memory controller
  delegated; probed once by ``memory_cgroup``) each sandbox gets its own (``make_cgroup``), joined by the
  sandbox's bootstrap before anything else runs, limited to ``memory_mb`` plus 32 MiB for the bootstrap, swap
  included where the kernel accounts it: every process, the tmpfs root, pipes and kernel memory count.
  ``cgroup_peak`` reads its peak, ``remove_cgroup`` kills what is left in it and removes it. Without one the bound
  is per process: ``memory_mb`` of address space times ``max_procs`` processes, plus the tmpfs, plus pipe buffers.
- Seccomp (x86_64, aarch64; ``SECCOMP_FILTER``, source the bootstrap runs, and ``denied_syscalls``): refuses
  ``memfd_create`` (anonymous files no address-space limit counts), SysV ``shmget``/``msgget`` (memory that
  outlives the process) and every syscall of another ABI (i386, x32).

``bootstrap_limits`` gathers what the bootstrap applies (rlimits, IPC limits, the seccomp list) for ``spawn``.
This module imports only the standard library.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, fields
from functools import lru_cache


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_s: float = 10.0  # wall-clock seconds before the whole process group is killed
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU)
    memory_mb: int = 512  # address space per process (RLIMIT_AS); with a memory cgroup also the whole sandbox
    max_procs: int = 16  # processes of the sandbox's uid (RLIMIT_NPROC): stops fork bombs
    file_size_mb: int = 16  # largest file it may write (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the private root filesystem (its /tmp and /work included)
    output_bytes: int = 1 << 20  # stdout and stderr caps each; beyond it the run is killed and fails

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"SandboxLimits.{f.name} must be positive, got {getattr(self, f.name)}")


def rlimits(limits: SandboxLimits) -> dict[str, int]:
    """The rlimits every process of the sandbox gets (by ``resource`` name).

    >>> rlimits(SandboxLimits(memory_mb=128))["RLIMIT_AS"] >> 20, rlimits(SandboxLimits())["RLIMIT_MSGQUEUE"]
    (128, 0)
    """
    mb = 1 << 20
    return {
        "RLIMIT_CPU": int(limits.cpu_s),
        "RLIMIT_AS": limits.memory_mb * mb,
        "RLIMIT_NPROC": limits.max_procs,
        "RLIMIT_FSIZE": limits.file_size_mb * mb,
        "RLIMIT_NOFILE": limits.open_files,
        "RLIMIT_CORE": 0,
        "RLIMIT_MSGQUEUE": 0,  # POSIX message queues: none (their memory outlives the process)
    }


def ipc_limits(limits: SandboxLimits) -> dict[str, int]:
    """The SysV limits of the sandbox's own IPC namespace (``/proc/sys/kernel`` names). SysV shared memory and
    message queues outlive the process that made them (until the IPC namespace ends): at most ``memory_mb`` of
    segments and a few small queues."""
    size = limits.memory_mb << 20
    return {"shmmax": size, "shmall": size // os.sysconf("SC_PAGE_SIZE"), "shmmni": 64, "msgmni": 4}


# Syscalls no candidate needs that make memory outside every per-process limit (memfd_create) or memory that
# outlives the sandbox where it shares the host's IPC namespace (shmget, msgget): (seccomp arch, numbers).
_DENIED = {"x86_64": (0xC000003E, [319, 29, 68]), "aarch64": (0xC00000B7, [279, 194, 186])}


# The seccomp filter, as source the sandbox's bootstrap runs in the child just before it execs the harness (never in
# this process: it would bind the trainer). It needs ``ctypes`` and ``libc = ctypes.CDLL(None, use_errno=True)``.
SECCOMP_FILTER = r"""
def deny_syscalls(arch, numbers):
    # A seccomp filter (classic BPF, no library): these syscalls of this architecture fail with EPERM, and so does
    # every syscall of another ABI (i386, x32), where the numbers differ. Where the kernel has no seccomp filters,
    # nothing is denied.
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    LD, JEQ, JGE, RET, ALLOW, DENY = 0x20, 0x15, 0x35, 0x06, 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
    n = len(numbers)
    insns = [Insn(LD, 0, 0, 4), Insn(JEQ, 1, 0, arch), Insn(RET, 0, 0, DENY), Insn(LD, 0, 0, 0),
             Insn(JGE, n + 1, 0, 0x40000000)]
    insns += [Insn(JEQ, n - j, 0, nr) for j, nr in enumerate(numbers)]
    insns += [Insn(RET, 0, 0, ALLOW), Insn(RET, 0, 0, DENY)]
    program = (Insn * len(insns))(*insns)
    prog = Prog(len(insns), ctypes.cast(program, ctypes.POINTER(Insn)))
    libc.prctl(22, 2, ctypes.byref(prog), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
"""


def denied_syscalls() -> tuple[int, list[int]] | None:
    """(seccomp audit arch, syscall numbers) the filter refuses on this machine, or None (no filter here)."""
    return _DENIED.get(os.uname().machine)


def bootstrap_limits(limits: SandboxLimits) -> dict:
    """What the sandbox's bootstrap applies besides the cgroup: ``rlimits`` (to the harness), ``ipc`` (to its IPC
    namespace) and ``deny`` (the seccomp filter's ``denied_syscalls``, None where there is none)."""
    return {"rlimits": rlimits(limits), "ipc": ipc_limits(limits), "deny": denied_syscalls()}


_CGROUP_HEADROOM_MB = 32  # the sandbox's bootstrap process and the kernel's bookkeeping, beyond memory_mb


def _cgroup_dir(version: int) -> str | None:
    """This process's own cgroup directory in its memory hierarchy (v1) or the unified one (v2), or None."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    path = next(
        (
            p
            for hid, ctl, p in lines
            if (version == 1 and "memory" in ctl.split(",")) or (version == 2 and hid == "0" and ctl == "")
        ),
        None,
    )
    if path is None:
        return None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            if (version == 1 and fstype == "cgroup" and "memory" in options) or (version == 2 and fstype == "cgroup2"):
                root, mountpoint = (x.encode().decode("unicode_escape") for x in fields[3:5])  # octal escapes
                rel = os.path.relpath(path, root)
                if rel.startswith(".."):
                    continue  # a mount of another part of the hierarchy
                return os.path.normpath(os.path.join(mountpoint, rel))
    return None


@lru_cache(maxsize=1)
def memory_cgroup() -> tuple[str | None, int, str]:
    """(the cgroup directory under which each sandbox gets its own memory cgroup, cgroup version, "") where this
    process may make them, else (None, 0, why not). Probed once: a child cgroup is made, limited, joined by a
    throwaway process and removed."""
    if sys.platform != "linux":
        return None, 0, f"cgroups need Linux, this is {sys.platform}"
    reason = "no writable memory cgroup (a v1 memory hierarchy, or v2 with the memory controller delegated)"
    for version in (1, 2):
        try:
            base = _cgroup_dir(version)
        except (OSError, ValueError, IndexError):
            continue
        if base is None:
            continue
        if version == 2:
            try:
                with open(os.path.join(base, "cgroup.subtree_control")) as f:
                    if "memory" not in f.read().split():
                        continue  # the memory controller is not delegated below this cgroup
            except OSError:
                continue
        probe = None
        try:
            probe = _new_cgroup(base, version, 64 << 20)
            join = "import sys; open(sys.argv[1], 'w').write('0')"
            subprocess.run(
                [os.path.realpath(sys.executable), "-I", "-S", "-c", join, os.path.join(probe, "cgroup.procs")],
                env={},
                check=True,
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError) as e:
            reason = f"cannot make or join a memory cgroup under {base}: {e}"
            continue
        finally:
            if probe is not None:
                remove_cgroup(probe)
        return base, version, ""
    return None, 0, reason


def _write(path: str, value: str, required: bool = True) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        if required:
            raise


def _new_cgroup(base: str, version: int, limit: int) -> str:
    path = os.path.join(base, f"smolalign-sandbox-{os.getpid()}-{secrets.token_hex(6)}")
    os.mkdir(path)
    try:
        if version == 1:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
            _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit), required=False)  # no swap either
        else:
            _write(os.path.join(path, "memory.max"), str(limit))
            _write(os.path.join(path, "memory.swap.max"), "0", required=False)
            _write(os.path.join(path, "memory.oom.group"), "1", required=False)
    except BaseException:
        remove_cgroup(path)
        raise
    return path


def make_cgroup(limits: SandboxLimits) -> str | None:
    """A fresh memory cgroup for one sandbox (every process in it, its tmpfs, memfds, SysV segments, pipes:
    memory_mb plus a small headroom in all), or None where memory cgroups are unavailable."""
    base, version, _ = memory_cgroup()
    if base is None:
        return None
    return _new_cgroup(base, version, (limits.memory_mb + _CGROUP_HEADROOM_MB) << 20)


def cgroup_peak(path: str) -> float | None:
    """The most memory (MiB) the cgroup at ``path`` held at once, or None where the kernel does not say."""
    for name in ("memory.max_usage_in_bytes", "memory.peak"):  # v1, v2 (Linux 5.19+)
        try:
            with open(os.path.join(path, name)) as f:
                return int(f.read()) / (1 << 20)
        except (OSError, ValueError):
            continue
    return None


def remove_cgroup(path: str, timeout_s: float = 5.0) -> None:
    """Kill whatever is left in the sandbox's cgroup (only its own processes are there) and remove it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        if os.path.exists(os.path.join(path, "cgroup.kill")):
            _write(os.path.join(path, "cgroup.kill"), "1", required=False)
        else:
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if time.monotonic() > deadline:
            warnings.warn(f"code sandbox: could not remove the memory cgroup {path}", RuntimeWarning, stacklevel=2)
            return
        time.sleep(0.01)
