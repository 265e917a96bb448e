"""Weights read when they are written, not when a model is loaded.

A source (safetensors, GGUF) gives each tensor as a ``LazyArray``: its shape and dtype, known
from the file's header, and how to read it. A family's ``convert_weights`` works on them as on
numpy arrays (concatenating q, k and v, stacking experts, reordering rows, ``astype``, adding
one to a norm), and what it builds is deferred too: nothing is read until the compiler quantizes
that one parameter and writes it (compile.py's ``_convert``). So compiling a model holds one
parameter's floats at a time, not the whole model's: a bf16 checkpoint of 0.84 B parameters
took 6.5 GB to compile eagerly (float32 copies of everything, fused copies beside them) and
an 8 B one would have needed about 60 GB.

Deferring works through numpy's own protocols (``__array_ufunc__`` for arithmetic,
``__array_function__`` for ``np.concatenate``, ``np.stack`` and the rest) and the ndarray
methods converters call (``reshape``, ``astype``, ``transpose``, ``swapaxes``, ``T``,
indexing, ``copy``). Anything else (an attribute this class does not know, ``np.asarray``)
reads the array there and then: slower for that tensor, never wrong. A result's shape comes
from a rule where one is cheap (the methods above, concatenation, broadcasting), else from
running the operation on stand-ins of the inputs' shapes that hold no data
(``np.broadcast_to`` of one zero).

Nothing is cached: an array used twice (a tied table, read as the embedding and as the head)
is read twice, each time only while it is needed.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin


class LazyArray(NDArrayOperatorsMixin):
    """An array computed on demand (``np.asarray(lazy)``); see the module docstring."""

    __slots__ = ("_compute", "_shape", "_dtype")
    __array_priority__ = 100

    def __init__(self, compute: Callable[[], np.ndarray], shape: tuple[int, ...],
                 dtype: Any) -> None:
        self._compute = compute
        self._shape = tuple(int(d) for d in shape)
        self._dtype = np.dtype(dtype)

    # -- what an array tells without its data ------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    def __len__(self) -> int:
        return self._shape[0]

    def __repr__(self) -> str:
        return f"LazyArray(shape={self._shape}, dtype={self._dtype})"

    # -- reading ---------------------------------------------------------------------------
    def read(self) -> np.ndarray:
        array = np.asarray(self._compute())
        if array.shape != self._shape or array.dtype != self._dtype:  # (a rule went wrong)
            raise AssertionError(f"deferred weight: computed {array.shape} {array.dtype}, "
                                 f"expected {self._shape} {self._dtype}")
        return array

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self.read()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __bool__(self) -> bool:
        return bool(self.read())

    def __float__(self) -> float:  # (a scalar weight: Apertus' xIELU parameters)
        return float(self.read())

    def __int__(self) -> int:
        return int(self.read())

    def __getattr__(self, name: str):
        # (an ndarray attribute without a rule here: read the array for it)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.read(), name)

    def __setitem__(self, key, value) -> None:
        raise TypeError("a weight read on demand cannot be changed in place; build a new "
                        "array (np.concatenate, np.where, arithmetic) instead")

    # -- deferred methods (shape rules) ------------------------------------------------------
    def astype(self, dtype, copy: bool = True) -> LazyArray:
        return LazyArray(lambda: self.read().astype(dtype, copy=copy), self._shape, dtype)

    def copy(self) -> LazyArray:
        return LazyArray(lambda: self.read().copy(), self._shape, self._dtype)

    def reshape(self, *shape, **kwargs) -> LazyArray:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return LazyArray(lambda: self.read().reshape(shape, **kwargs),
                         _stand_in(self).reshape(shape, **kwargs).shape, self._dtype)

    def transpose(self, *axes) -> LazyArray:
        return self._view(lambda a: a.transpose(*axes))

    def swapaxes(self, a1: int, a2: int) -> LazyArray:
        return self._view(lambda a: a.swapaxes(a1, a2))

    @property
    def T(self) -> LazyArray:  # noqa: N802 - numpy's name
        return self._view(lambda a: a.T)

    def __getitem__(self, key) -> LazyArray:
        return self._view(lambda a: a[key])

    def _view(self, op: Callable[[np.ndarray], np.ndarray]) -> LazyArray:
        """An operation whose result is a view of its input: its shape from a stand-in."""
        return LazyArray(lambda: op(self.read()), op(_stand_in(self)).shape, self._dtype)

    # -- numpy's protocols ---------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(isinstance(o, LazyArray) for o in kwargs.get("out") or ()):
            raise TypeError("a weight read on demand cannot be a ufunc's out= (it is not changed "
                            "in place); assign the result instead")
        if (method != "__call__" or "out" in kwargs or ufunc.nout != 1
                or ufunc.signature is not None):  # (matmul's shape is no broadcast: read now)
            return getattr(ufunc, method)(*_read_all(inputs), **_read_all(kwargs))
        shape = np.broadcast_shapes(*(np.shape(x) for x in inputs))
        # the result's dtype from the ufunc on one element of each input
        one = [np.zeros((1,) * x.ndim, x.dtype) if isinstance(x, (LazyArray, np.ndarray))
               else x for x in inputs]
        dtype = ufunc(*one, **kwargs).dtype
        return LazyArray(lambda: ufunc(*_read_all(inputs), **_read_all(kwargs)), shape, dtype)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.concatenate or func is np.stack:
            arrays = list(args[0])
            axis = kwargs.get("axis", args[1] if len(args) > 1 else 0)
            dtype = np.result_type(*(a.dtype for a in arrays))
            shapes = [tuple(a.shape) for a in arrays]
            if axis is None:  # (flattened first: numpy's own rule on stand-ins)
                return _deferred(func, args, kwargs)
            if func is np.stack:
                axis = axis % (len(shapes[0]) + 1)
                shape = shapes[0][:axis] + (len(arrays),) + shapes[0][axis:]
                agree = all(s == shapes[0] for s in shapes)
            else:
                axis = axis % len(shapes[0])
                shape = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
                agree = all(len(s) == len(shapes[0]) and s[:axis] + s[axis + 1:]
                            == shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes)
            if not agree:  # (as numpy would say it, now rather than when the weight is read)
                raise ValueError(f"{func.__name__}: the arrays' shapes {shapes} do not agree")
            if kwargs.get("dtype") is not None:
                dtype = np.dtype(kwargs["dtype"])
            return LazyArray(lambda: func(*_read_all(args), **_read_all(kwargs)), shape, dtype)
        if func in (np.shape, np.ndim, np.size):
            return func(_stand_in(args[0]), *args[1:], **kwargs)
        return _deferred(func, args, kwargs)


def _deferred(func, args, kwargs):
    """``func`` on the arguments, deferred: its result's shape and dtype from stand-ins holding
    no data; a function whose result's shape depends on the data (np.unique, np.nonzero) or
    that is not an array runs now, on the data."""
    if func in _DATA_SHAPED:
        return func(*_read_all(args), **_read_all(kwargs))
    result = func(*_stand_ins(args), **_stand_ins(kwargs))
    if not isinstance(result, np.ndarray):  # (a scalar, a tuple: it needs the data)
        return func(*_read_all(args), **_read_all(kwargs))
    return LazyArray(lambda: func(*_read_all(args), **_read_all(kwargs)), result.shape,
                     result.dtype)


_DATA_SHAPED = {np.unique, np.nonzero, np.flatnonzero, np.argwhere, np.extract, np.compress,
                np.trim_zeros}


def read(array) -> np.ndarray:
    """``array`` as a numpy array (a ``LazyArray`` read now; anything else as it is)."""
    return array.read() if isinstance(array, LazyArray) else array


def _stand_in(array: LazyArray) -> np.ndarray:
    """An array of ``array``'s shape and dtype that holds no data (one zero, broadcast)."""
    return np.broadcast_to(np.zeros((), array.dtype), array.shape)


def _each_lazy(value, fn: Callable[[LazyArray], Any]):
    """``value`` (an argument: an array, a list, tuple or dict of them, anything else) with
    ``fn`` applied to each LazyArray in it."""
    if isinstance(value, LazyArray):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_each_lazy(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _each_lazy(v, fn) for k, v in value.items()}
    return value


def _stand_ins(value):
    return _each_lazy(value, _stand_in)


def _read_all(value):
    return _each_lazy(value, LazyArray.read)
