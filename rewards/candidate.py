"""The candidate's side of a judged run (``rewards.judge``): the server that runs in the solution's sandbox.

It runs the solution as a module named ``solution`` (multiprocessing and pickle find its functions), says which
names it defines, then answers calls with plain data (``rewards.wire``, whose source is sent before this one). It
never sees the tests, the expected values or the verdict channel. Everything here runs beside untrusted code and
may be tampered with: it only ever produces data the judge checks, so tampering can only make the candidate fail.

So that a solution behaves as it would with the tests in one process, during a call:

- what it prints (``print``, ``sys.stdout``/``sys.stderr`` writes) crosses as events, in order, which the judge
  replays through its own ``print`` and streams: the tests' patched ``print`` or ``redirect_stdout`` see it;
- ``input(prompt)`` and reads of ``sys.stdin`` (``read``, ``readline``, iteration, ``buffer``) ask the judge,
  which answers from its own ``input`` and ``sys.stdin`` (patched or replaced by the tests) with the value, or
  the exception (``EOFError`` at the end of the input), before the call goes on;
- after the tests call ``random.seed`` or ``random.setstate``, the next call carries the judge's generator state,
  so the solution draws from the seed the tests set. Nothing goes back: the solution's draws, or its own seed,
  never move the tests' generator (tests that draw random inputs could otherwise be steered to inputs the
  solution chose, or predicted: one process would allow that, a judge must not).

Between calls (the solution's own top-level code) input is this process's own, at its end, and output is this
process's (reported as the candidate's stdout).
"""

SERVER = r"""
def _serve():
    import builtins, io, os, random, sys, traceback, types
    from collections.abc import Iterator
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # a solution may return a 5,000-digit factorial
    spec = json.loads(sys.stdin.readline())
    rfd, wfd = spec["fds"]
    inbox = bytearray()
    now = {"id": None, "events": [], "size": 0}  # the call being served (None between calls), what it printed
    cap = spec["max_output"]  # characters a call may print: beyond it the solution fails, as a flood does

    def count(n):
        now["size"] += n
        if now["size"] > cap:
            sys.__stderr__.write(f"the solution printed more than {cap} characters in one call\n")
            flush()
            os._exit(1)

    def send(message):
        data = json.dumps(message).encode() + b"\n"
        while data:
            data = data[os.write(wfd, data):]

    def recv():
        scanned = 0
        while (end := inbox.find(b"\n", scanned)) < 0:
            scanned = len(inbox)
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                os._exit(0)  # the judge is done
            inbox.extend(chunk)
        line = bytes(inbox[:end])
        del inbox[: end + 1]
        return json.loads(line)

    def flush():
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass

    def why(e):
        try:
            return f"{type(e).__name__}: {e}"[:2000]
        except BaseException:
            return type(e).__name__[:200]

    def events():
        out, now["events"], now["size"] = now["events"], [], 0
        return [["write", e[1], "".join(e[2])] if e[0] == "write" else e for e in out]

    def ask(request):  # a read of input during a call: the judge answers it
        request["id"], request["events"] = now["id"], events()
        send(request)
        reply = recv()
        if "raise" in reply:
            raise exception_from(reply["raise"])
        return decode(reply["value"])

    class Out:  # sys.stdout / sys.stderr during a call
        encoding, errors, newlines, closed = "utf-8", "strict", None, False

        def __init__(self, name):
            self.name, self.buffer = name, OutBytes(self)

        def write(self, s):
            if not isinstance(s, str):
                raise TypeError(f"write() argument must be str, not {type(s).__name__}")
            count(len(s))
            log = now["events"]
            if log and log[-1][0] == "write" and log[-1][1] == self.name:
                log[-1][2].append(str.__str__(s))
            else:
                log.append(["write", self.name, [str.__str__(s)]])
            return len(s)

        def writelines(self, lines):
            for line in lines:
                self.write(line)

        def flush(self):
            pass

        def isatty(self):
            return False

        def readable(self):
            return False

        def writable(self):
            return True

        def seekable(self):
            return False

        def fileno(self):
            raise io.UnsupportedOperation("fileno")

    class OutBytes:
        closed = False

        def __init__(self, text):
            self.text = text

        def write(self, b):
            data = bytes(memoryview(b))
            self.text.write(data.decode("utf-8", "replace"))
            return len(data)

        def flush(self):
            pass

    class In:  # sys.stdin (and its buffer): during a call, the judge's sys.stdin is read
        encoding, errors, newlines, closed = "utf-8", "strict", None, False

        def __init__(self, real, prefix=""):
            self.real, self.prefix = real, prefix
            if not prefix:
                self.buffer = In(getattr(real, "buffer", None), "buffer.")

        def _read(self, method, arg):
            if not isinstance(arg, int) and arg is not None:
                raise TypeError(f"argument should be integer or None, not '{type(arg).__name__}'")
            if now["id"] is None:
                return getattr(self.real, method)(-1 if arg is None else arg)
            return ask({"stdin": [self.prefix + method, -1 if arg is None else arg]})

        def read(self, size=-1):
            return self._read("read", size)

        def readline(self, size=-1):
            return self._read("readline", size)

        def readlines(self, hint=-1):
            return self._read("readlines", hint)

        def __iter__(self):
            return self

        def __next__(self):
            line = self.readline()
            if not line:
                raise StopIteration
            return line

        def isatty(self):
            return False

        def readable(self):
            return True

        def fileno(self):
            return 0  # fd-level reads are this process's own (empty) input, as a patched sys.stdin leaves them

        def close(self):
            pass

    out, err = Out("stdout"), Out("stderr")
    real_print, real_input = builtins.print, builtins.input

    def shown(a):  # a print argument as plain data when it prints the same, else as the text print shows
        text = str(a)
        if not isinstance(a, Iterator):
            try:
                wired = encode(a)
                if str(decode(wired)) == text:
                    return wired
            except BaseException:
                pass
        return text

    def print_(*args, **kwargs):
        target = kwargs.get("file")
        target = sys.stdout if target is None else target
        if now["id"] is None or (target is not out and target is not err) or \
                set(kwargs) - {"sep", "end", "file", "flush"}:
            return real_print(*args, **kwargs)
        for key in ("sep", "end"):
            value = kwargs.get(key)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{key} must be None or a string, not {type(value).__name__}")
        kw = {k: kwargs[k] for k in ("sep", "end") if k in kwargs}
        if "flush" in kwargs:
            kw["flush"] = bool(kwargs["flush"])
        if "file" in kwargs:
            kw["file"] = None if kwargs["file"] is None else target.name
        wired = [shown(a) for a in args]
        count(sum(len(json.dumps(a)) for a in wired) + len(kw.get("sep") or "") + len(kw.get("end") or ""))
        now["events"].append(["print", wired, kw])

    def input_(*args):
        if now["id"] is None:
            return real_input(*args)
        if len(args) > 1:
            raise TypeError(f"input expected at most 1 argument, got {len(args)}")
        return ask({"input": [shown(a) for a in args]})

    builtins.print, builtins.input, sys.stdin = print_, input_, In(sys.stdin)
    module = types.ModuleType("solution")  # a real module: multiprocessing and pickle find its functions
    sys.modules["solution"] = module
    ns = vars(module)
    try:
        exec(compile(spec["code"], "solution.py", "exec"), ns)
    except BaseException as e:
        traceback.print_exc()
        flush()
        send({"error": why(e)})
        os._exit(1)
    names = {}
    for name, value in list(ns.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names[name] = ["module", value.__name__]
        else:
            names[name] = ["callable" if callable(value) else "value"]
    flush()
    send({"hello": names})
    mutable = (list, dict, set, bytearray, Counter, OrderedDict, defaultdict, deque)  # changed in place: sent back
    while True:
        request = recv()
        rid = request["id"]
        if "get" in request:  # a plain global the tests read (a constant the solution defines)
            try:
                reply = {"id": rid, "value": encode(ns[request["get"]]), "args": [], "kwargs": {}}
            except BaseException as e:
                reply = {"id": rid, "invalid": why(e)}
            send(reply)
            continue
        saved = sys.stdout, sys.stderr
        now["id"] = rid
        try:
            if "random" in request:
                random.setstate(decode(request["random"]))
            sys.stdout, sys.stderr = out, err
            try:
                args = [decode(a) for a in request["args"]]
                kwargs = {k: decode(v) for k, v in request["kwargs"].items()}
                value = ns[request["call"]](*args, **kwargs)
            except BaseException as e:  # whatever it is: the judge decides what the tests may see of it
                reply = {"id": rid, "raise": exception_spec(e)}
            else:
                try:  # a value that is not plain data is the solution's failure, never an exception a test catches
                    reply = {"id": rid, "value": encode(value),
                             "args": [encode(a) if type(a) in mutable else None for a in args],
                             "kwargs": {k: encode(v) for k, v in kwargs.items() if type(v) in mutable}}
                except BaseException as e:
                    reply = {"id": rid, "invalid": why(e)}
        finally:
            sys.stdout, sys.stderr = saved
            now["id"] = None
        reply["events"] = events()
        flush()
        send(reply)
_serve()
"""
