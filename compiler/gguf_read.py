"""Opening a GGUF file: the ``gguf`` package's reader, with its metadata parse made fast, and
one open reader per file version.

``gguf.GGUFReader`` parses every metadata value into numpy views of the mapped file, one per
array element, through ``_get``; a tokenizer's vocabulary and merges make that ~750k calls for
Qwen2.5's 151k tokens (13 s on a 2-core Zen 3). ``_get`` slices the ``np.memmap`` itself, and
each slice of a memmap runs its Python ``__array_finalize__``; it also builds a dtype each call
to learn an item size. ``FastGGUFReader`` overrides only ``_get``: the same views, cut from a
plain ndarray view of the same mapping (4x faster). Everything else -- fields, parts, tensors,
byte order -- is the package's code, and a test compares both readers field by field.

A compile reads a GGUF twice (its architecture and width mix to choose the variant, then the
model); ``open_gguf`` keeps readers by (path, mtime, size) so both share one parse, until
``forget_readers()`` (at the end of each compile, ``readers_shared_within``: a reader holds the
file's mapping and ~100 MB of metadata views, which a long ``wick serve`` should not keep).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

_ITEM_SIZES: dict = {}
_NATIVE_ORDERS = {"I", "<" if sys.byteorder == "little" else ">"}


class FastGGUFReader(GGUFReader):
    """``gguf.GGUFReader`` with a faster ``_get`` (same arrays: same offsets, dtypes, bytes)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self.__dict__.get("_plain")
        if plain is None:  # set on first use: __init__ calls _get before returning
            plain = self._plain = self.data.view(np.ndarray)
        size = _ITEM_SIZES.get(dtype)
        if size is None:
            size = _ITEM_SIZES[dtype] = np.dtype(dtype).itemsize
        count = int(count)
        arr = plain[offset:offset + size * count].view(dtype)
        order = self.byte_order if override_order is None else override_order
        if order in _NATIVE_ORDERS:
            return arr
        return arr.view(arr.dtype.newbyteorder(order))


@functools.lru_cache(maxsize=2)
def _open(path: str, mtime_ns: int, size: int) -> FastGGUFReader:
    return FastGGUFReader(path)


def forget_readers() -> None:
    _open.cache_clear()


def readers_shared_within(fn):
    """``fn`` with the readers it opened forgotten when it returns (or raises)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            forget_readers()

    return call


def open_gguf(path: str | Path) -> FastGGUFReader:
    """A read-only reader of ``path``, shared while the file is unchanged. Callers only read it
    (its arrays are views of a read-only mapping)."""
    stat = Path(path).stat()
    return _open(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
