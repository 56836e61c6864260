"""The sources a sandbox runs inside itself (``rewards.sandbox`` starts them as ``python -I -S -c <source>``).

- ``BOOTSTRAP`` runs first inside the namespaces: it joins the sandbox's memory cgroup, builds the new root on a
  size-limited tmpfs (read-only binds of the system and the Python installation; ``/dev/null``, ``/dev/zero``,
  ``/dev/random``, ``/dev/urandom``; ``/dev/stdin``, ``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd`` as links into
  the sandbox's own ``/proc``, which lists only its own processes; a private, size-limited ``/dev/shm``; a private
  ``/tmp`` and the working directory ``/work``), ``pivot_root``s into it, then forks the harness with the limits
  applied (rlimits, the throwaway uid, ``no_new_privs``, the seccomp filter of ``rewards.limits``) and stays as the
  pid namespace's first process until the harness exits.
- ``PROGRAM`` is the harness of a plain program (``rewards.sandbox.run_program``).

Why a module of its own: this is code that runs on the far side of the sandbox's walls, as source text, with
nothing of ours importable; ``rewards.sandbox`` is the trusted side that starts, feeds, watches and reaps it.
"""

from rewards.limits import SECCOMP_FILTER

# The bootstrap runs first inside the namespaces: it builds the new root, then forks the harness with
# the limits applied (rlimits, uid, no_new_privs, rewards.limits' seccomp filter ``deny_syscalls``) and stays
# as the pid namespace's first process, reaping, until the harness exits.
BOOTSTRAP = (
    r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
if cfg["cgroup"]:  # first of all: this process and every one it starts count against the sandbox's memory cgroup
    with open(cfg["cgroup"] + "/cgroup.procs", "w") as f:
        f.write("0")
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
ATIME = {1024: 1024, 2048: 2048, 4096: 1 << 21}  # statvfs ST_NOATIME/NODIRATIME/RELATIME -> MS_ flags

def ok(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox setup: {what}: {os.strerror(err)}")

def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    ok(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {dst}")

if cfg["isolate"]:
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    for key, value in cfg["ipc"].items():  # this IPC namespace's own SysV limits: no segment outlives its bound
        try:
            with open("/proc/sys/kernel/" + key, "w") as f:
                f.write(str(value))
        except OSError:
            pass
    root = "/tmp"
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_mb']}m,mode=755")
    for p in cfg["binds"]:
        dst = root + p
        if os.path.islink(p):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(p), dst)
            continue
        if not os.path.isdir(p) or os.path.exists(dst):
            continue
        os.makedirs(dst)
        mount(p, dst, None, MS_BIND | MS_REC)
        f = os.statvfs(p).f_flag
        keep = (f & MS_NOEXEC) | sum(v for k, v in ATIME.items() if f & k)
        mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)
    os.makedirs(root + "/dev")
    for d in ("null", "zero", "random", "urandom"):
        open(root + "/dev/" + d, "w").close()
        mount("/dev/" + d, root + "/dev/" + d, None, MS_BIND)
    for name, target in (("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("fd", "/proc/self/fd")):
        os.symlink(target, root + "/dev/" + name)
    os.makedirs(root + "/dev/shm")  # POSIX shared memory and semaphores (multiprocessing): private, size-limited
    mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_mb']}m,mode=1777")
    # This pid namespace's own /proc (the /dev links above resolve through it): it lists only this sandbox's
    # processes, those of other uids hidden, and nothing outside them (subset=pid, where the kernel has it).
    # Where the kernel refuses a new proc (a container that masks parts of its own), the sandbox has no /proc and
    # the /dev links dangle, as before they existed.
    os.makedirs(root + "/proc")
    for options in ("hidepid=2,subset=pid", "hidepid=2"):
        try:
            mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
            break
        except OSError:
            continue
    os.makedirs(root + "/tmp", mode=0o1777)
    os.chmod(root + "/tmp", 0o1777)
    os.makedirs(root + "/work", mode=0o700)
    if cfg["uid"] is not None:
        os.chown(root + "/work", cfg["uid"], cfg["uid"])
    os.mkdir(root + "/.old")
    nr = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
    if nr is None:
        raise OSError(f"sandbox setup: pivot_root syscall number unknown on {os.uname().machine}")
    ok(libc.syscall(nr, root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    ok(libc.umount2(b"/.old", 2), "detach the old root")  # MNT_DETACH
    os.rmdir("/.old")
    os.chdir("/work")
else:
    os.chdir(cfg["workdir"])
"""
    + SECCOMP_FILTER
    + r"""
pid = os.fork()
if pid == 0:
    try:
        for name, value in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        if cfg["uid"] is not None:
            for fd in (0, 1, 2):  # its own pipes: /dev/stdin & co. reopen them through /proc/self/fd
                try:
                    os.fchown(fd, cfg["uid"], cfg["uid"])
                except OSError:
                    pass
            os.setgroups([])
            os.setgid(cfg["uid"])
            os.setuid(cfg["uid"])
        elif cfg["isolate"]:
            ok(libc.unshare(0x10000000), "shed namespace capabilities")  # CLONE_NEWUSER
        ok(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
        if cfg["deny"]:
            deny_syscalls(*cfg["deny"])
        os.execve(cfg["python"], [cfg["python"], "-I", "-S", "-X", "utf8", "-c", cfg["harness"]], {})
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {e}\n".encode())
        os._exit(125)
for fd in cfg["pass_fds"]:  # only the harness holds the pipes it was given: its exit closes them
    os.close(fd)
_, status = os.waitpid(pid, 0)
sys.stdout.flush()
os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""
)

# A plain program (``run_program``): the candidate's code run as the real ``__main__`` module (so that
# multiprocessing finds its functions), ``exit()``/``quit()`` defined as ``site`` would (``-S`` leaves them out). Its
# fd 0 brings a length-prefixed spec, read with os.read, then the case's input: the input is copied to an unlinked
# file in the working directory that becomes fd 0, as a judge's input file is, so ``os.fstat(0).st_size`` is its size
# and ``/dev/stdin``, ``open(0)``, ``sys.stdin.buffer`` all read it. Its exit status and output are all it reports;
# ``rewards.judge`` judges tests.
PROGRAM = r"""
def _program():
    import builtins, json, os, sys, tempfile, _sitebuiltins

    def read(n):
        data = bytearray()
        while len(data) < n:
            chunk = os.read(0, n - len(data))
            if not chunk:
                break
            data += chunk
        return bytes(data)

    code = json.loads(read(int(read(16))))["code"]
    with tempfile.TemporaryFile(dir=os.getcwd()) as f:
        while chunk := os.read(0, 1 << 16):
            f.write(chunk)
        f.flush()
        os.lseek(f.fileno(), 0, os.SEEK_SET)
        os.dup2(f.fileno(), 0)
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    sys.argv = ["solution.py"]
    main = vars(sys.modules["__main__"])
    for name in [k for k in main if k not in ("__name__", "__doc__", "__builtins__", "__spec__", "__loader__")]:
        del main[name]
    exec(compile(code, "solution.py", "exec"), main)
_program()
"""
