"""``wick.engine.backend.Backend`` over the worker's executors: WebGPU (web/src/executor.ts)
and WebAssembly (web/src/wasm_executor.ts).

WebGPU: one engine step is ONE call into JavaScript: ``runStep(writeMeta, writeData, dispatches,
uniforms, reads)`` with flat typed arrays, answered by a promise of the read bytes. Encoding of
a dispatch (int32 words): ``kernel, nstorage, (buffer, offset, size) * nstorage, uniform_len,
gx, gy, gz``; the uniforms of all dispatches are concatenated in ``uniforms`` in order.
The grid stays unfolded: the executor folds x > 65535 into x * z (docs/kernel-abi.md).

WebAssembly: one step is ONE synchronous call, ``runCalls(writeMeta, writeData, calls, reads)``;
a call is encoded ``function, nargs, (buffer, offset, dtype, ndim, dims...) * nargs`` with
``dtype`` the DLPack word (code | bits << 8 | lanes << 16) the kernels check.
"""

from __future__ import annotations

import json
from array import array
from typing import Any, Hashable, Sequence

from wick.engine.backend import (DLPACK_DTYPES, Backend, BufferHandle, Call, Dispatch,
                                 KernelSpec, Read, Write)
from wick.engine.errors import DeviceError


def _u8(data: Any):
    from js import Uint8Array  # type: ignore[import-not-found]

    mv = memoryview(data).cast("B")
    out = Uint8Array.new(mv.nbytes)
    if mv.nbytes:
        out.assign(mv)
    return out


def _i32(values: array):
    from js import Int32Array  # type: ignore[import-not-found]

    out = Int32Array.new(len(values))
    if len(values):
        out.assign(values)
    return out


def _encoded(item: Any, cache: dict | None, encode) -> array:
    """``encode(item)``, remembered in ``cache`` per object (plans reuse their dispatch and
    call objects from step to step)."""
    if cache is None:
        return encode(item)
    hit = cache.get(id(item))
    if hit is not None and hit[0] is item:
        return hit[1]
    enc = encode(item)
    cache[id(item)] = (item, enc)  # keeps item alive, so its id stays unique
    return enc


def _dispatch_words(d: Dispatch) -> array:
    enc = array("i", [d.kernel, len(d.storage)])
    for s in d.storage:
        enc.extend((s.buffer, s.offset, s.size))
    enc.extend((len(d.uniform), *d.grid))
    return enc


def encode_dispatches(dispatches: Sequence[Dispatch], cache: dict | None = None) -> tuple[array, bytearray]:
    """The flat int32 words and the concatenated uniform bytes of a step's dispatches."""
    words = array("i")
    uniforms = bytearray()
    for d in dispatches:
        words.extend(_encoded(d, cache, _dispatch_words))
        uniforms += d.uniform
    return words, uniforms


class _ExecutorBackend(Backend):
    """What both executors share: the device description from ``infoJson()``, buffers by
    handle, step timings, and the packing of a step's writes and reads."""

    def __init__(self, executor: Any) -> None:
        self._x = executor
        info = json.loads(executor.infoJson())
        self.name: str = info["name"]
        self.features = frozenset(info["features"])
        self.max_storage_binding: int = info["maxStorageBufferBindingSize"]
        self.max_buffer_size: int = info["maxBufferSize"]
        self.storage_offset_alignment: int = info["minStorageBufferOffsetAlignment"]
        self._info = info
        self._encoded: dict[int, tuple[Any, array]] = {}  # per-step encodings, by object
        self.steps = 0

    @property
    def js_encode_ms(self) -> float:
        return self._x.encodeMs

    @property
    def device_wait_ms(self) -> float:
        return self._x.waitMs

    def alloc(self, nbytes: int) -> BufferHandle:
        return int(self._x.alloc(int(nbytes)))

    def free(self, buffer: BufferHandle) -> None:
        self._x.free(buffer)

    def write(self, buffer: BufferHandle, offset: int, data: bytes | memoryview) -> None:
        self._x.write(buffer, offset, _u8(data))

    @staticmethod
    def _pack(writes: Sequence[Write], reads: Sequence[Read]) -> tuple[Any, Any, Any]:
        """(writeMeta, writeData, readMeta) as JS typed arrays."""
        meta = array("i")
        data = bytearray()
        for w in writes:
            meta.extend((w.buffer, w.offset, len(w.data)))
            data += w.data
        rmeta = array("i")
        for r in reads:
            rmeta.extend((r.buffer, r.offset, r.size))
        return _i32(meta), _u8(data), _i32(rmeta)

    def _unpack(self, raw: Any, reads: Sequence[Read]) -> list[bytes]:
        """The reads' bytes from the executor's answer (each at a 4-byte aligned position)."""
        self.steps += 1
        blob = raw.to_bytes()
        out, pos = [], 0
        for r in reads:
            out.append(blob[pos:pos + r.size])
            pos += (r.size + 3) // 4 * 4
        return out


class WebGPUBackend(_ExecutorBackend):
    """The Backend contract, forwarded to a JS ``Executor`` (one JS call per step)."""

    reads_async = True  # (a WebGPU readback is a promise)

    def __init__(self, executor: Any) -> None:
        super().__init__(executor)
        self.is_software = bool(self._info.get("fallback"))  # e.g. SwiftShader

    def load_kernels(self, kernels: Sequence[KernelSpec]) -> int:
        payload = json.dumps([
            {"name": k.name, "wgsl": k.wgsl, "entry_point": k.entry_point,
             "storage_access": list(k.storage_access), "uniform": k.uniform}
            for k in kernels
        ])
        return int(self._x.loadKernels(payload))

    async def check(self) -> None:
        """Raise the first asynchronous WebGPU error (kernel compile, validation) so far."""
        err = await self._x.popErrors()
        if err:
            raise DeviceError(f"{self.name}: {err}")

    def run(self, writes: Sequence[Write], dispatches: Sequence[Dispatch],
            reads: Sequence[Read], step: Hashable | None = None) -> list[bytes]:
        raise DeviceError("the WebGPU backend reads back asynchronously: use run_async")

    async def run_async(self, writes: Sequence[Write], dispatches: Sequence[Dispatch],
                        reads: Sequence[Read], step: Hashable | None = None) -> list[bytes]:
        meta, data, rmeta = self._pack(writes, reads)
        words, uniforms = encode_dispatches(dispatches, self._encoded)
        raw = await self._x.runStep(meta, data, _i32(words), _u8(uniforms), rmeta)
        return self._unpack(raw, reads)


def _call_words(c: Call) -> array:
    enc = array("i", [c.function, len(c.args)])
    for t in c.args:
        code, bits = DLPACK_DTYPES[t.dtype]
        enc.extend((t.buffer, t.offset, code | bits << 8 | 1 << 16, len(t.shape), *t.shape))
    return enc


def encode_calls(calls: Sequence[Call], cache: dict | None = None) -> array:
    """The flat int32 words of a step's library calls."""
    words = array("i")
    for c in calls:
        words.extend(_encoded(c, cache, _call_words))
    return words


class WasmBackend(_ExecutorBackend):
    """The Backend contract (``kind = "wasm"``), forwarded to a JS ``WasmExecutor``: the
    artifact's WebAssembly kernel set, one synchronous JS call per step."""

    kind = "wasm"  # or another of artifact.py WASM_KINDS: the manifest's kernel set the executor runs
    prefers_f32 = True

    def __init__(self, executor: Any) -> None:
        super().__init__(executor)
        self.threads: int = self._info["threads"]
        self.kind = self._info["library"]

    def load_library(self, entry: dict, path: str, data: bytes) -> int:
        # (synchronous: a worker may compile a module of any size without awaiting)
        return int(self._x.loadLibrary(_u8(data), json.dumps(entry)))

    async def check(self) -> None:
        """(errors are raised where they happen)"""

    def profile_json(self) -> str:
        """``{kernels: [{name, ms, calls}] (the slowest so far), threads, helperTasks}``."""
        return str(self._x.profileJson())

    def run(self, writes: Sequence[Write], dispatches: Sequence[Call],
            reads: Sequence[Read], step: Hashable | None = None) -> list[bytes]:
        meta, data, rmeta = self._pack(writes, reads)
        try:
            raw = self._x.runCalls(meta, data, _i32(encode_calls(dispatches, self._encoded)), rmeta)
        except Exception as e:  # a kernel's own check, a trap, memory exhausted
            raise DeviceError(f"{self.name}: {getattr(e, 'message', e)}") from None
        return self._unpack(raw, reads)
