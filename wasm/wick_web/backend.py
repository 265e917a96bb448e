"""``wick.engine.backend.Backend`` over the worker's WebGPU executor (web/src/executor.ts).

One engine step is ONE call into JavaScript: ``runStep(writeMeta, writeData, dispatches,
uniforms, reads)`` with flat typed arrays, answered by a promise of the read bytes. Encoding of
a dispatch (int32 words): ``kernel, nstorage, (buffer, offset, size) * nstorage, uniform_len,
gx, gy, gz``; the uniforms of all dispatches are concatenated in ``uniforms`` in order.
The grid stays unfolded: the executor folds x > 65535 into x * z (docs/kernel-abi.md).
"""

from __future__ import annotations

import json
from array import array
from typing import Any, Sequence

from wick.engine.backend import BufferHandle, Dispatch, KernelSpec, Read, Write
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


def encode_dispatches(dispatches: Sequence[Dispatch], cache: dict | None = None) -> tuple[array, bytearray]:
    """The flat int32 words and the concatenated uniform bytes of a step's dispatches."""
    words = array("i")
    uniforms = bytearray()
    for d in dispatches:
        enc = None
        if cache is not None:
            hit = cache.get(id(d))
            if hit is not None and hit[0] is d:
                enc = hit[1]
        if enc is None:
            enc = array("i", [d.kernel, len(d.storage)])
            for s in d.storage:
                enc.extend((s.buffer, s.offset, s.size))
            enc.extend((len(d.uniform), *d.grid))
            if cache is not None:
                cache[id(d)] = (d, enc)  # keeps d alive, so its id stays unique
        words.extend(enc)
        uniforms += d.uniform
    return words, uniforms


class WebGPUBackend:
    """The Backend contract, forwarded to a JS ``Executor`` (one JS call per step)."""

    def __init__(self, executor: Any) -> None:
        self._x = executor
        info = json.loads(executor.infoJson())
        self.name: str = info["name"]
        self.software: bool = bool(info.get("fallback"))  # e.g. SwiftShader
        self.features = frozenset(info["features"])
        self.max_storage_binding: int = info["maxStorageBufferBindingSize"]
        self.max_buffer_size: int = info["maxBufferSize"]
        self.storage_offset_alignment: int = info["minStorageBufferOffsetAlignment"]
        self._encoded: dict[int, tuple[Dispatch, array]] = {}
        self.steps = 0

    @property
    def js_encode_ms(self) -> float:
        return self._x.encodeMs

    @property
    def device_wait_ms(self) -> float:
        return self._x.waitMs

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

    def alloc(self, nbytes: int) -> BufferHandle:
        return int(self._x.alloc(int(nbytes)))

    def free(self, buffer: BufferHandle) -> None:
        self._x.free(buffer)

    def write(self, buffer: BufferHandle, offset: int, data: bytes | memoryview) -> None:
        self._x.write(buffer, offset, _u8(data))

    def run(self, writes: Sequence[Write], dispatches: Sequence[Dispatch],
            reads: Sequence[Read]) -> list[bytes]:
        raise DeviceError("the WebGPU backend reads back asynchronously: use run_async")

    async def run_async(self, writes: Sequence[Write], dispatches: Sequence[Dispatch],
                        reads: Sequence[Read]) -> list[bytes]:
        meta = array("i")
        data = bytearray()
        for w in writes:
            meta.extend((w.buffer, w.offset, len(w.data)))
            data += w.data
        words, uniforms = encode_dispatches(dispatches, self._encoded)
        rmeta = array("i")
        for r in reads:
            rmeta.extend((r.buffer, r.offset, r.size))
        raw = await self._x.runStep(_i32(meta), _u8(data), _i32(words), _u8(uniforms), _i32(rmeta))
        self.steps += 1
        blob = raw.to_bytes()
        out, pos = [], 0
        for r in reads:
            out.append(blob[pos:pos + r.size])
            pos += (r.size + 3) // 4 * 4
        return out
