"""The CUDA kernel set and backend without a GPU (issue #14's CI part).

* The CUDA source of the tiny model and SmolLM2 compiles with NVRTC (the real compiler, from the
  nvidia-cuda-nvrtc wheel) for the oldest architecture the artifact names and for an H100.
* The backend's own logic runs over a fake driver that checks every launch against the kernel's
  signature in that source: the argument count and types, each pointer inside a live buffer,
  the thread block equal to the kernel's ``__launch_bounds__``. A whole engine (prefill,
  batched decode, sampling) runs on it; repeated steps replay a captured graph.

What only a GPU can show (the kernels' results) is issue #14's GPU part: bench/gpu.py and
the parity run named in its note.
"""

from __future__ import annotations

import ctypes
import json
import re
import struct
from pathlib import Path

import pytest

from tests.e2e.helpers import SMOLLM2, greedy, ids_of, make_core, run_core
from wick.engine.backend import BufferSlice, Dispatch, Read, Write
from wick.engine.errors import DeviceError
from wick.native import nvrtc
from wick.native.cuda_backend import CudaBackend

_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)')
_C_TYPES = {"int": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint": ctypes.c_uint32,
            "float": ctypes.c_float, "unsigned int": ctypes.c_uint32}


def kernel_signatures(source: str) -> dict[str, tuple[int, list[str]]]:
    """kernel name -> (launch bounds, parameter C types) read off the CUDA source."""
    out = {}
    for bound, name, params in _SIGNATURE.findall(source):
        types = []
        for p in params.split(","):
            decl = p.replace("__restrict__", "").strip()
            types.append("ptr" if "*" in decl else decl.rsplit(" ", 1)[0].strip())
        out[name] = (int(bound), types)
    return out


class FakeDriver:
    """CudaDriver's methods over host memory; ``launch`` checks the arguments against the
    kernel signatures of ``source`` and records them instead of running anything."""

    name = "Fake GPU"
    compute_capability = (9, 0)
    total_memory = 80 << 30

    def __init__(self, source: str = "") -> None:
        self.signatures = kernel_signatures(source)
        self.memory: dict[int, bytearray] = {}
        self.next_address = 1 << 32
        self.functions: dict[int, str] = {}
        self.launches: list[tuple] = []  # (kernel, grid, block, shared, args)
        self.capturing: list | None = None
        self.graphs: dict[int, list] = {}
        self.graph_runs = 0
        self.graphs_made = 0  # (handles are never reused, as the driver's)
        self.images: list[bytes] = []

    def make_current(self) -> None:
        pass

    def malloc(self, nbytes: int) -> int:
        address = self.next_address
        self.next_address += (nbytes + 4095) // 4096 * 4096 + 4096
        self.memory[address] = bytearray(nbytes)
        return address

    def free(self, address: int) -> None:
        del self.memory[address]

    def _find(self, address: int, nbytes: int = 0) -> tuple[bytearray, int]:
        for base, mem in self.memory.items():
            if base <= address and address + nbytes <= base + len(mem):
                return mem, address - base
        raise AssertionError(f"address {address:#x} (+{nbytes}) is in no live buffer")

    def upload(self, address: int, data) -> None:
        data = bytes(data)
        mem, off = self._find(address, len(data))
        mem[off:off + len(data)] = data

    def download(self, address: int, nbytes: int) -> bytearray:
        mem, off = self._find(address, nbytes)
        return bytearray(mem[off:off + nbytes])

    def synchronize(self) -> None:
        pass

    def load_module(self, image: bytes) -> str:
        self.images.append(image)
        return "module"

    def unload_module(self, module) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def function(self, module, name: str, shared: int = 0) -> int:
        assert name in self.signatures, f"{name} is not a kernel of the source"
        handle = 1000 + len(self.functions)
        self.functions[handle] = name
        return handle

    def launch(self, function: int, grid, block, shared, params) -> None:
        name = self.functions[function]
        bound, types = self.signatures[name]
        assert len(params) == len(types), f"{name}: {len(params)} arguments, wants {len(types)}"
        args = []
        for address, c in zip(params, types):
            if c == "ptr":
                pointer = ctypes.c_uint64.from_address(address).value
                self._find(pointer)  # inside a live buffer
                args.append(pointer)
            else:
                args.append(_C_TYPES[c].from_address(address).value)
        assert block[0] * block[1] * block[2] == bound, f"{name}: block {block}, bounds {bound}"
        assert min(grid) >= 1, f"{name}: empty grid {grid}"
        record = (name, tuple(grid), tuple(block), shared, tuple(args))
        (self.capturing if self.capturing is not None else self.launches).append(record)

    def begin_capture(self) -> None:
        assert self.capturing is None
        self.capturing = []

    def end_capture(self) -> int:
        self.graphs_made += 1
        handle = 5000 + self.graphs_made
        self.graphs[handle], self.capturing = self.capturing, None
        return handle

    def launch_graph(self, graph: int) -> None:
        self.launches.extend(self.graphs[graph])
        self.graph_runs += 1

    def destroy_graph(self, graph: int) -> None:
        del self.graphs[graph]


def _source(art_dir: Path) -> tuple[str, dict]:
    manifest = json.loads((Path(art_dir) / "wick-artifact.json").read_text())
    entry = manifest["kernel_sets"]["cuda"]
    return (Path(art_dir) / entry["file"]).read_text(), entry


@pytest.mark.parametrize("quant", ["q0f32", "q4f16_1", "q4f32_1"])
def test_tiny_model_cuda_source_compiles_with_nvrtc(quant, request):
    # the tiny Llama's small build (tests/conftest.py), shared with the browser tests; q4f32_1:
    # the batched GEMV of float32 rows (two 16-byte loads a step, sums written to the output)
    if quant == "q4f32_1":
        from tests.conftest import TINY_SMALL

        art = request.getfixturevalue("compiled")(request.getfixturevalue("tiny_llama_dir"),
                                                  "q4f32_1", **TINY_SMALL)
    else:
        art = request.getfixturevalue({"q0f32": "tiny_artifact",
                                       "q4f16_1": "tiny_f16_artifact"}[quant])
    source, entry = _source(art)
    signatures = kernel_signatures(source)
    # every kernel the launches name is in the source, with the metadata's scalars and block
    assert {k["name"] for k in entry["kernels"]} == set(signatures)
    for k in entry["kernels"]:
        bound, types = signatures[k["name"]]
        scalars = [t for t in types if t != "ptr"]
        assert len(scalars) == len(k["scalar_dtypes"]), k["name"]
        assert k["block"][0] * k["block"][1] * k["block"][2] == bound
    ptx = nvrtc.compile_cuda(source, f"compute_{entry['arch'].removeprefix('sm_')}")
    assert ptx.startswith(b"//") and b".entry" in ptx
    assert ptx.count(b".entry") == len(entry["kernels"])
    cubin = nvrtc.compile_cuda(source, "sm_90")  # an H100's own code
    assert cubin[:4] == b"\x7fELF"


def test_smollm2_cuda_source_compiles_with_nvrtc(compiled):
    source, entry = _source(compiled(SMOLLM2, "q0f32"))
    ptx = nvrtc.compile_cuda(source, "sm_90")
    assert ptx[:4] == b"\x7fELF"
    # every plan's TIR function has its CUDA launches
    manifest = json.loads((Path(compiled(SMOLLM2, "q0f32")) / "wick-artifact.json").read_text())
    called = {i["func"] for p in manifest["plans"].values() for i in p["instrs"] if i["op"] == "call"}
    assert called <= set(entry["tir_functions"])


def test_nvrtc_compile_error_is_named():
    with pytest.raises(DeviceError, match=r"(?s)NVRTC could not compile bad.cu.*undefined_thing"):
        nvrtc.compile_cuda('extern "C" __global__ void k() { undefined_thing(); }', "sm_90",
                           name="bad.cu")


def test_launch_records_pointers_scalars_and_graphs():
    """A hand-made kernel entry: the backend passes buffer + offset, each scalar at its width,
    the kernel's block; the second run of one step (its key) is captured, the third replayed;
    a step without a key is never captured; freeing a buffer drops the graphs."""
    source = ('typedef long long int64_t;\n'
              'extern "C" __global__ void __launch_bounds__(128) scale(float* __restrict__ x, '
              'int64_t n, float s) { }')
    drv = FakeDriver(source)
    be = CudaBackend(drv)
    entry = {"arch": "sm_80", "kernels": [{"name": "scale", "scalar_dtypes": ["int64", "float32"],
                                           "block": [128, 1, 1], "shared": 0}]}
    base = be.load_library(entry, "x/kernels.cu", source.encode())
    assert drv.images and drv.images[0][:4] == b"\x7fELF"  # compiled by NVRTC for sm_90
    buf = be.alloc(4096)
    d = Dispatch(base, (BufferSlice(buf, 512, 1024),), struct.pack("<qf", 1 << 33, 2.5), (3, 2, 1))
    out = be.run([Write(buf, 0, b"\x01\x02\x03\x04")], [d], [Read(buf, 0, 4)], "step")
    assert out == [b"\x01\x02\x03\x04"]
    address = be._buffers[buf][0]
    assert drv.launches == [("scale", (3, 2, 1), (128, 1, 1), 0, (address + 512, 1 << 33, 2.5))]
    for _ in range(3):  # one-offs: launched, never captured
        be.run([], [d], [])
    assert be.graph_launches == 0 and not drv.graphs
    be.run([], [d], [], "step")  # second time: captured, then replayed
    be.run([], [d], [], "step")  # third: replayed
    assert be.graph_launches == 2 and len(drv.graphs) == 1
    assert drv.launches == [drv.launches[0]] * 6
    be.free(buf)
    assert not drv.graphs


def test_older_gpu_is_refused_with_the_working_device():
    drv = FakeDriver("")
    drv.compute_capability = (7, 5)
    be = CudaBackend(drv)
    with pytest.raises(DeviceError, match="sm_80 or newer.*--device vulkan"):
        be.load_library({"arch": "sm_80", "kernels": []}, "x/kernels.cu", b"")


def test_engine_steps_on_the_cuda_backend(tiny_f16_artifact):
    """The real runner and engine over the fake device: prefill, batched decode and sampling
    launch every kernel with arguments matching its signature, and the decode steps of one
    batch size run as one graph."""
    art = tiny_f16_artifact
    source, entry = _source(art)
    drv = FakeDriver(source)
    be = CudaBackend(drv)
    core = make_core(art, be, num_pages=16)
    run_core(core, [ids_of(40, 1), ids_of(9, 2)], greedy(6))
    launched = {name for name, *_ in drv.launches}
    assert {"batch_prefill_paged_kv_kernel", "sample_token_kernel",
            "tir_kv_cache_transpose_append_kernel"} <= launched
    assert any(n.startswith("decode_") for n in launched)  # the batched-GEMV plan ran
    assert be.graph_launches >= 3 and drv.graph_runs == be.graph_launches
    # the decode plans attend with their own CUDA kernel (window_attention's, one block per
    # row and head), the prefill with TVM's
    assert "decode_batch_prefill_paged_kv_kernel" in launched


def test_decode_plans_share_their_cuda_attention(tiny_f16_artifact):
    """Only the CUDA set's decode attention differs from the prefill's: the plans call it by
    one name in every kernel set (decode and decode1 alike), and the CUDA source holds it once."""
    import json

    m = json.loads((tiny_f16_artifact / "wick-artifact.json").read_text())
    calls = {p: {i["func"] for i in m["plans"][p]["instrs"]
                 if i["op"] == "call" and "paged_kv" in i["func"]}
             for p in ("forward", "decode", "decode1")}
    assert calls == {"forward": {"batch_prefill_paged_kv"},
                     "decode": {"decode_batch_prefill_paged_kv"},
                     "decode1": {"decode_batch_prefill_paged_kv"}}
    for functions in (m["kernel_sets"]["webgpu"]["tir_functions"],
                      m["kernel_sets"]["cuda"]["tir_functions"]):
        assert {f for f in functions if "paged_kv" in f} == set(calls["forward"] | calls["decode"])
    cuda = {k["name"] for k in m["kernel_sets"]["cuda"]["kernels"] if "paged_kv" in k["name"]}
    assert cuda == {"batch_prefill_paged_kv_kernel", "decode_batch_prefill_paged_kv_kernel"}
    source, _ = _source(tiny_f16_artifact)
    assert "__launch_bounds__(64) decode_batch_prefill_paged_kv_kernel" in source


def test_auto_falls_back_when_cuda_cannot_run_the_model(tiny_f16_artifact, monkeypatch, caplog):
    """``device="auto"`` picked CUDA on a GPU older than the kernels' sm_80: the model loads on
    the next device instead (here the CPU kernels), and the log says why."""
    import wick.native.devices as devices
    from wick.server.local import build_core

    old_gpu = FakeDriver("")
    old_gpu.compute_capability = (7, 5)
    monkeypatch.setattr(devices, "_cuda_if_present", lambda: CudaBackend(old_gpu))
    art = tiny_f16_artifact
    with caplog.at_level("WARNING", logger="wick.engine"):
        core = build_core(str(art), device="auto", kv_cache_bytes=1 << 20)
    assert core.runner.backend.kind == "cpu"
    assert "CUDA cannot run" in caplog.text and "sm_80 or newer" in caplog.text
    with pytest.raises(DeviceError, match="sm_80 or newer"):  # asked for by name: the error
        build_core(str(art), backend=CudaBackend(old_gpu), kv_cache_bytes=1 << 20)


def test_cuda_set_is_scheduled_for_cuda(tiny_f16_artifact):
    """The CUDA set's GEMVs and matmuls are scheduled for CUDA, not like the WebGPU set's:
    dlight schedules a module in place, and the CUDA set once got the WebGPU schedules (64-thread
    GEMV blocks, 8x8 matmul tiles) because the WebGPU lowering ran first on the same module."""
    m = json.loads((tiny_f16_artifact / "wick-artifact.json").read_text())
    webgpu_dir = tiny_f16_artifact / "kernels" / "webgpu"
    differs = {}
    for k in m["kernel_sets"]["cuda"]["kernels"]:
        if "matmul" not in k["name"]:
            continue
        wgsl = (webgpu_dir / f"{k['name']}.wgsl").read_text()
        workgroup = [int(x) for x in re.search(r"@workgroup_size\((\d+), (\d+), (\d+)\)",
                                               wgsl).groups()]
        differs[k["name"]] = k["block"] != workgroup
    assert differs and all(differs.values()), differs


def test_decode_gemvs_are_batched_warp_gemvs(tiny_f16_artifact):
    """The decode plans' dequantize-GEMVs are compiler/batched_gemv.py's: four warps a block
    (threadIdx.y), each warp's lanes (up to 32, threadIdx.x) splitting the reduction, in decode
    and decode1 alike (dlight's LowBatchGEMV runs 64x4 or 32x16 blocks)."""
    _, entry = _source(tiny_f16_artifact)
    blocks = {k["name"]: k["block"] for k in entry["kernels"]
              if k["name"].startswith(("decode_", "decode1_")) and "dequantize_matmul" in k["name"]}
    warp = {n for n, (x, y, z) in blocks.items() if y == 4 and z == 1 and x <= 32}
    assert len(warp) >= 6, blocks
    assert {n.split("_", 1)[1] for n in warp if n.startswith("decode_")} == \
        {n.split("_", 1)[1] for n in warp if n.startswith("decode1_")}, blocks
