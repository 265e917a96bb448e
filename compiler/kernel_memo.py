"""Kernels written in TVMScript, built once per process for each set of arguments.

Building a TVMScript kernel parses its Python source, and TVM's parser walks the whole call
stack for each function (``inspect.stack()`` reads every frame's source): 0.2-1.4 s per kernel
here, 5-8 s of a tiny model's compile, paid again by each compile of the same shapes (a
model's variants, a second model of one family, the test suite's ~50 compiles). A builder is a
pure function of its arguments and a PrimFunc is immutable (``specialize`` and ``with_attr``
return new functions), so the function built once serves every later compile. The bytes of
an artifact do not change (checked against artifacts compiled without it). Each builder keeps
its ``KEEP`` most recently used kernels: a long ``wick serve`` compiling model after model does
not keep every shape it ever built.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

# kernels kept per builder: a model's compile asks each builder for a few shapes (its head
# sizes, vocabulary, dtypes), the test suite's ~50 compiles a few dozen
KEEP = 128


class _Unkeyable(Exception):
    pass


def _key(value):
    """A hashable key that tells apart what a builder would build differently (1, 1.0 and
    True stay three keys: TVMScript makes an int, a float and a bool of them)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return type(value).__name__, value
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return "dict", tuple(sorted((str(k), _key(v)) for k, v in value.items()))
    if type(value).__name__ == "Target":  # tvm.target.Target: its JSON description
        return "Target", str(value)
    raise _Unkeyable(type(value).__name__)


def built_once(builder: F) -> F:
    """``builder`` remembering what it built, by its arguments (called through, unremembered,
    with an argument it cannot key)."""
    built: OrderedDict = OrderedDict()  # least recently used first
    lock = threading.Lock()

    @functools.wraps(builder)
    def build(*args, **kwargs):
        try:
            key = _key(args), _key(kwargs)
        except _Unkeyable:
            return builder(*args, **kwargs)
        with lock:
            if key in built:
                built.move_to_end(key)
                return built[key]
        func = builder(*args, **kwargs)  # (outside the lock: two threads may both build it)
        with lock:
            func = built.setdefault(key, func)
            built.move_to_end(key)
            while len(built) > KEEP:
                built.popitem(last=False)
            return func

    return build  # type: ignore[return-value]
