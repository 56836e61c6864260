r"""Plain values across a process boundary: the only thing the code judge believes from a candidate.

``dumps(value)`` turns plain Python data into one line of JSON, ``loads(line)`` builds it back. Plain data is
``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bytearray`` and ``list``, ``tuple``,
``dict``, ``set``, ``frozenset`` of plain data, checked by exact type (a subclass of ``int`` with its own
``__eq__`` is not an ``int``). Containers other than lists are tagged, so ``(1, 2)`` stays a tuple and
``{1: "a"}`` keeps its int key:

    >>> dumps([1, (2.5, "x"), {3: None}, {True}])
    b'[1, {"tuple": [2.5, "x"]}, {"dict": [[3, null]]}, {"set": [true]}]\n'
    >>> loads(dumps([1, (2.5, "x"), {3: None}, {True}]))
    [1, (2.5, 'x'), {3: None}, {True}]

Why it is safe for the judge: ``loads`` parses with ``json`` only (never pickle, never ``eval``) and
constructs fresh builtin objects of the exact types above, so whatever bytes a hostile candidate sends, the
judge compares its own ``int``s and ``list``s with its own ``==``. Anything else is refused:

    >>> class Always:
    ...     def __eq__(self, other):
    ...         return True
    >>> dumps(Always())
    Traceback (most recent call last):
    ...
    TypeError: not plain data: Always
    >>> loads(b'{"eq": "always"}')
    Traceback (most recent call last):
    ...
    ValueError: not plain data: a dict with keys ['eq']

This module imports only the standard library: ``rewards.judge`` ships its source text into the sandboxed
processes (which run ``python -I -S``), so the candidate's side and the judge's side speak the same format.
"""

import json

MAX_DEPTH = 64  # deeper nesting is refused (a self-containing list, or a recursion bomb)
_SCALARS = (type(None), bool, int, float, str)
_TAGS = ("tuple", "dict", "set", "frozenset", "bytes", "bytearray", "complex")


def encode(value, depth=0):
    """Plain data -> a JSON-able tree (tagged containers); TypeError for anything else."""
    if depth > MAX_DEPTH:
        raise TypeError(f"not plain data: nested deeper than {MAX_DEPTH}")
    t = type(value)
    if t in _SCALARS:
        return value
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {t.__name__: [encode(v, depth + 1) for v in value]}
    if t is bytes or t is bytearray:
        return {t.__name__: value.hex()}
    if t is complex:
        return {"complex": [value.real, value.imag]}
    raise TypeError(f"not plain data: {t.__name__}")


def decode(tree, depth=0):
    """A tree from ``encode`` -> fresh builtin values; ValueError for anything ``encode`` cannot produce."""
    if depth > MAX_DEPTH:
        raise ValueError(f"not plain data: nested deeper than {MAX_DEPTH}")
    t = type(tree)
    if t in _SCALARS:
        return tree
    if t is list:
        return [decode(v, depth + 1) for v in tree]
    if t is not dict or len(tree) != 1 or next(iter(tree)) not in _TAGS:
        keys = sorted(tree) if t is dict else t.__name__
        raise ValueError(f"not plain data: a {t.__name__} with keys {keys}" if t is dict else f"not plain data: {keys}")
    tag, body = next(iter(tree.items()))
    if tag in ("bytes", "bytearray"):
        if type(body) is not str:
            raise ValueError(f"not plain data: {tag} must be hex text")
        return (bytes if tag == "bytes" else bytearray).fromhex(body)
    if type(body) is not list:
        raise ValueError(f"not plain data: {tag} must hold a list")
    if tag == "complex":
        if len(body) != 2 or not all(type(x) in (int, float) for x in body):
            raise ValueError("not plain data: complex must be [real, imag]")
        return complex(body[0], body[1])
    if tag == "dict":
        if not all(type(kv) is list and len(kv) == 2 for kv in body):
            raise ValueError("not plain data: dict must hold [key, value] pairs")
        try:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
        except TypeError as e:  # an unhashable key
            raise ValueError(f"not plain data: {e}") from None
    items = [decode(v, depth + 1) for v in body]
    try:
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    except TypeError as e:  # an unhashable member of a set
        raise ValueError(f"not plain data: {e}") from None


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
