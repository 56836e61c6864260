r"""Plain values across a process boundary: the only thing the code judge believes from a candidate.

``dumps(value)`` turns plain Python data into one line of JSON, ``loads(line)`` builds it back. Plain data is
``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bytearray`` and ``list``, ``tuple``,
``dict``, ``set``, ``frozenset`` of plain data, checked by exact type. Containers other than lists are tagged,
so ``(1, 2)`` stays a tuple and ``{1: "a"}`` keeps its int key:

    >>> dumps([1, (2.5, "x"), {3: None}, {True}])
    b'[1, {"tuple": [2.5, "x"]}, {"dict": [[3, null]]}, {"set": [true]}]\n'
    >>> loads(dumps([1, (2.5, "x"), {3: None}, {True}]))
    [1, (2.5, 'x'), {3: None}, {True}]

So that a test's own conversion or comparison gives what it would give in-process, some standard types cross
as themselves (tagged, rebuilt from the judge's own standard library): ``collections.Counter``,
``OrderedDict``, ``defaultdict`` (its factory when it is a builtin or ``collections`` type, else the value
it returns once, as a constant), ``deque``, ``fractions.Fraction``, ``decimal.Decimal``, ``range`` and the
dict views. An iterator (a generator, ``map``, ``zip``, ...) is drained when it crosses (at most
``MAX_ITEMS`` items) and rebuilt as an iterator over the same items (a generator for a generator), raising
at the end what the original raised. A subclass of a builtin type (an ``IntEnum``, a ``namedtuple``) crosses
as the builtin value it holds, read with the builtin's own methods, never its overrides:

    >>> from collections import Counter
    >>> from fractions import Fraction
    >>> loads(dumps([Counter("aab"), Fraction(1, 3), map(abs, [-1, 2])]))
    [Counter({'a': 2, 'b': 1}), Fraction(1, 3), <list_iterator object at ...>]

Exceptions cross as ``[class name, str(e), builtin classes of its MRO, args]``; ``exception_from`` builds,
on the judge's side, an exception of a fresh class deriving from those builtin classes, so that
``except ArithmeticError`` catches a solution's ``ZeroDivisionError`` and ``except ValueError`` its
``class MyError(ValueError)``. Exceptions that steer control flow rather than report an error
(``StopIteration``, which ``map`` or ``all`` would swallow silently, ``StopAsyncIteration``,
``GeneratorExit``, ``KeyboardInterrupt``, ``SystemExit``, anything not an ``Exception``) become
``CandidateExit`` and are recorded in ``FATAL``: the judge fails the run whatever the tests catch.

Why it is safe for the judge: ``loads`` parses with ``json`` only (never pickle, never ``eval``) and
constructs fresh objects of builtin or standard-library types, so whatever bytes a hostile candidate sends,
the judge compares its own ``int``s, ``list``s and ``Counter``s with their own ``==``. Anything else is refused:

    >>> class Always:
    ...     def __eq__(self, other):
    ...         return True
    >>> dumps(Always())
    Traceback (most recent call last):
    ...
    rewards.wire.NotPlainData: not plain data: Always
    >>> loads(b'{"eq": "always"}')
    Traceback (most recent call last):
    ...
    ValueError: not plain data: a dict with keys ['eq']

This module imports only the standard library: ``rewards.judge`` ships its source text into the sandboxed
processes (which run ``python -I -S``), so the candidate's side and the judge's side speak the same format.
"""

import builtins
import json
import types
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction

MAX_DEPTH = 64  # deeper nesting is refused (a self-containing list, or a recursion bomb)
MAX_ITEMS = 1 << 20  # an iterator longer than this (an infinite generator) is not plain data
_SCALARS = (type(None), bool, int, float, str)
_TAGS = (
    "tuple",
    "dict",
    "set",
    "frozenset",
    "bytes",
    "bytearray",
    "complex",
    "Counter",
    "OrderedDict",
    "defaultdict",
    "deque",
    "Fraction",
    "Decimal",
    "range",
    "dict_keys",
    "dict_values",
    "dict_items",
    "iterator",
)
_KEYS, _VALUES, _ITEMS = type({}.keys()), type({}.values()), type({}.items())
# a defaultdict's factory crosses by name when it is one of these
_FACTORIES = {
    c.__name__: c
    for c in (
        int,
        float,
        complex,
        str,
        bytes,
        bool,
        list,
        tuple,
        dict,
        set,
        frozenset,
        bytearray,
        Counter,
        OrderedDict,
        deque,
        Fraction,
        Decimal,
    )
}
# exceptions that steer control flow: never raised again in the judge
_CONTROL = ("StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit")
FATAL = []  # the judge's side: why the candidate failed in a way no test may catch (a control-flow exception, ...)


class NotPlainData(TypeError):
    """A value that plain data cannot carry (a custom object, a lambda, an infinite iterator)."""


class CandidateExit(BaseException):
    """The solution exited, broke the protocol, sent something that is not plain data or raised an exception
    that steers control flow. Not an ``Exception``: ``except Exception`` in a test does not catch it, and the
    judge fails the run even when a bare ``except`` does (see ``FATAL``)."""


def fatal(message):
    """Record ``message`` in ``FATAL`` and return the ``CandidateExit`` to raise."""
    FATAL.append(message)
    return CandidateExit(message)


def exception_spec(e):
    """An exception -> ``[class name, str(e), names of the builtin classes in its MRO, args or None]``."""
    t = type(e)
    bases = [
        c.__name__ for c in t.__mro__ if getattr(builtins, c.__name__, None) is c and issubclass(c, BaseException)
    ]
    try:
        text = str(e)[:2000]
    except BaseException:
        text = "<unprintable>"
    try:
        args = encode(list(e.args))
    except BaseException:
        args = None
    return [str(t.__name__)[:200], text, bases, args]


def _check_spec(spec):
    if (
        type(spec) is not list
        or len(spec) != 4
        or type(spec[0]) is not str
        or type(spec[1]) is not str
        or type(spec[2]) is not list
        or not all(type(b) is str for b in spec[2])
    ):
        raise ValueError("not plain data: a malformed exception")
    return spec


def exception_from(spec):
    """An exception of a fresh class deriving from the builtin classes ``spec`` names (the judge's side); a
    control-flow exception, or one that is no ``Exception``, gives a ``CandidateExit`` recorded in ``FATAL``."""
    name, text, bases, args = _check_spec(spec)
    classes = [getattr(builtins, b, None) for b in bases]
    classes = [c for c in classes if isinstance(c, type) and issubclass(c, BaseException)]
    if not any(issubclass(c, Exception) for c in classes) or any(c.__name__ in _CONTROL for c in classes):
        return fatal(f"the solution raised {name}: {text}"[:2000])
    leaves = [c for c in classes if not any(o is not c and issubclass(o, c) for o in classes)]
    try:
        args = tuple(decode(args)) if type(args) is list else (text,)
    except ValueError:
        args = (text,)
    label = name if name.isidentifier() else "CandidateError"
    for bases_ in (tuple(leaves), *((c,) for c in leaves), (Exception,)):
        try:
            cls = _CLASSES.get((label, bases_)) or _CLASSES.setdefault(
                (label, bases_), type(label, bases_, {"__module__": "solution", "__str__": _text})
            )
        except Exception:  # bases that cannot be combined
            continue
        for a in (args, (text,), ()):
            try:
                exc = cls(*a)
            except Exception:
                continue
            exc._text = text  # str(e) as the solution's process printed it
            return exc
    return Exception(f"{name}: {text}")


_CLASSES = {}  # (name, builtin bases) -> the class rebuilt for it: one class per name, as in the solution


def _text(self):
    return self.__dict__.get("_text", "")


def _int(x):
    return int.__index__(x)


def _pairs(value, depth):
    return [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value]


def _drain(value, depth):
    items, raised = [], None
    while True:
        try:
            item = next(value)
        except StopIteration:
            break
        except BaseException as e:  # the rebuilt iterator raises it at the same point
            raised = exception_spec(e)
            break
        items.append(encode(item, depth + 1))
        if len(items) > MAX_ITEMS:
            raise NotPlainData(f"not plain data: an iterator longer than {MAX_ITEMS} items")
    kind = "generator" if type(value) is types.GeneratorType else "iterator"
    return {"iterator": [kind, items, raised]}


def _factory(f):
    if f is None:
        return None
    if isinstance(f, type) and _FACTORIES.get(f.__name__) is f:
        return f.__name__
    try:
        return {"const": encode(f())}
    except BaseException:
        return None


# subclasses of builtin types: the builtin value they hold, read by the builtin's own methods
_SUBCLASSES = (
    (int, _int),
    (float, lambda x: float.__float__(x)),
    (complex, lambda x: complex(float(x.real), float(x.imag))),
    (str, lambda x: str.__str__(x)),
    (bytes, lambda x: bytes(memoryview(x))),
    (bytearray, lambda x: bytearray(memoryview(x))),
    (list, lambda x: list(list.__iter__(x))),
    (tuple, lambda x: tuple(tuple.__iter__(x))),
    (dict, lambda x: dict(dict.items(x))),
    (frozenset, lambda x: frozenset(frozenset.__iter__(x))),
    (set, lambda x: set(set.__iter__(x))),
)


def encode(value, depth=0):
    """Plain data -> a JSON-able tree (tagged containers); NotPlainData (a TypeError) for anything else."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"not plain data: nested deeper than {MAX_DEPTH}")
    t = type(value)
    if t in _SCALARS:
        return value
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"dict": _pairs(value.items(), depth)}
    if t is set or t is frozenset:
        return {t.__name__: [encode(v, depth + 1) for v in value]}
    if t is bytes or t is bytearray:
        return {t.__name__: value.hex()}
    if t is complex:
        return {"complex": [value.real, value.imag]}
    # standard types that cross as themselves (a subclass of one crosses as the standard type)
    if isinstance(value, Counter):
        return {"Counter": _pairs(dict.items(value), depth)}
    if isinstance(value, OrderedDict):
        return {"OrderedDict": _pairs(dict.items(value), depth)}
    if isinstance(value, defaultdict):
        return {"defaultdict": [_factory(value.default_factory), _pairs(dict.items(value), depth)]}
    if isinstance(value, deque):
        return {"deque": [value.maxlen, [encode(v, depth + 1) for v in value]]}
    if isinstance(value, Fraction):
        return {"Fraction": [_int(value.numerator), _int(value.denominator)]}
    if isinstance(value, Decimal):
        return {"Decimal": Decimal.__str__(value)}
    if t is range:
        return {"range": [value.start, value.stop, value.step]}
    if isinstance(value, _KEYS):
        return {"dict_keys": [encode(v, depth + 1) for v in value]}
    if isinstance(value, _VALUES):
        return {"dict_values": [encode(v, depth + 1) for v in value]}
    if isinstance(value, _ITEMS):
        return {"dict_items": _pairs(value, depth)}
    if isinstance(value, Iterator):
        return _drain(value, depth)
    for base, plain in _SUBCLASSES:
        if isinstance(value, base):
            return encode(plain(value), depth)
    raise NotPlainData(f"not plain data: {t.__name__}")


def _replay(items, raised):
    yield from items
    if raised is not None:
        raise exception_from(raised)


def _decode_pairs(body, depth):
    if type(body) is not list or not all(type(kv) is list and len(kv) == 2 for kv in body):
        raise ValueError("not plain data: a mapping must hold [key, value] pairs")
    return [(decode(k, depth + 1), decode(v, depth + 1)) for k, v in body]


def _decode_list(body, depth, tag):
    if type(body) is not list:
        raise ValueError(f"not plain data: {tag} must hold a list")
    return [decode(v, depth + 1) for v in body]


def _const_factory(tree, depth):
    decode(tree, depth + 1)  # checked now; each call builds a fresh copy, as the original factory would
    return lambda: decode(tree, depth + 1)


def _build(tag, body, depth):
    ints = lambda xs: type(xs) is list and all(type(x) is int for x in xs)  # noqa: E731
    if tag in ("bytes", "bytearray"):
        if type(body) is not str:
            raise ValueError(f"not plain data: {tag} must be hex text")
        return (bytes if tag == "bytes" else bytearray).fromhex(body)
    if tag == "complex":
        if type(body) is not list or len(body) != 2 or not all(type(x) in (int, float) for x in body):
            raise ValueError("not plain data: complex must be [real, imag]")
        return complex(body[0], body[1])
    if tag == "Decimal":
        if type(body) is not str:
            raise ValueError("not plain data: Decimal must be text")
        return Decimal(body)
    if tag == "Fraction":
        if not ints(body) or len(body) != 2 or body[1] == 0:
            raise ValueError("not plain data: Fraction must be [numerator, denominator]")
        return Fraction(body[0], body[1])
    if tag == "range":
        if not ints(body) or len(body) != 3:
            raise ValueError("not plain data: range must be [start, stop, step]")
        return range(*body)
    if tag in ("dict", "Counter", "OrderedDict", "dict_items"):
        pairs = _decode_pairs(body, depth)
        if tag == "Counter":
            out = Counter()
            dict.update(out, pairs)  # the counts as they are (Counter.update would add them)
            return out
        return {"dict": dict, "OrderedDict": OrderedDict, "dict_items": lambda p: dict(p).items()}[tag](pairs)
    if tag == "defaultdict":
        if type(body) is not list or len(body) != 2:
            raise ValueError("not plain data: defaultdict must be [factory, pairs]")
        f = body[0]
        if f is None or type(f) is str:
            if f is not None and f not in _FACTORIES:
                raise ValueError(f"not plain data: defaultdict factory {f[:50]!r}")
            factory = None if f is None else _FACTORIES[f]
        elif type(f) is dict and list(f) == ["const"]:
            factory = _const_factory(f["const"], depth)
        else:
            raise ValueError("not plain data: a malformed defaultdict factory")
        return defaultdict(factory, _decode_pairs(body[1], depth))
    if tag == "deque":
        if type(body) is not list or len(body) != 2 or not (body[0] is None or type(body[0]) is int):
            raise ValueError("not plain data: deque must be [maxlen, items]")
        return deque(_decode_list(body[1], depth, tag), body[0])
    if tag == "iterator":
        if type(body) is not list or len(body) != 3 or body[0] not in ("generator", "iterator"):
            raise ValueError("not plain data: iterator must be [kind, items, raised]")
        items = _decode_list(body[1], depth, tag)
        raised = None if body[2] is None else _check_spec(body[2])
        return _replay(items, raised) if body[0] == "generator" or raised is not None else iter(items)
    items = _decode_list(body, depth, tag)
    return {
        "tuple": tuple,
        "set": set,
        "frozenset": frozenset,
        "dict_keys": lambda xs: dict.fromkeys(xs).keys(),
        "dict_values": lambda xs: dict(enumerate(xs)).values(),
    }[tag](items)


def decode(tree, depth=0):
    """A tree from ``encode`` -> fresh values; ValueError for anything ``encode`` cannot produce."""
    if depth > MAX_DEPTH:
        raise ValueError(f"not plain data: nested deeper than {MAX_DEPTH}")
    t = type(tree)
    if t in _SCALARS:
        return tree
    if t is list:
        return [decode(v, depth + 1) for v in tree]
    if t is not dict or len(tree) != 1 or next(iter(tree)) not in _TAGS:
        keys = sorted(tree) if t is dict else t.__name__
        raise ValueError(
            f"not plain data: a {t.__name__} with keys {keys}" if t is dict else f"not plain data: {keys}"
        )
    tag, body = next(iter(tree.items()))
    try:
        return _build(tag, body, depth)
    except ValueError:
        raise
    except Exception as e:  # an unhashable key or member, a bad Decimal, a zero step, ...
        raise ValueError(f"not plain data: {tag}: {type(e).__name__}") from None


def dumps(value):
    """Plain data -> one line of JSON bytes (ending in a newline)."""
    return json.dumps(encode(value)).encode() + b"\n"


def loads(line):
    """One line from ``dumps`` -> fresh plain data; ValueError for anything else (bad JSON included)."""
    try:
        tree = json.loads(line)
    except RecursionError:
        raise ValueError("not plain data: nested too deep") from None
    return decode(tree)
