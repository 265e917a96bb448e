"""Calling one function of a wick WebAssembly kernel module under node (wasm_call.mjs), for
tests/compiler/test_wasm_kernels.py and bench/cpu_gemv.py --wasm: the arguments go through
files, outputs included, and the relaxed-SIMD probe is the browser executor's own."""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# DLPack's dtype words: code | bits << 8 | lanes << 16
DTYPE_WORDS = {"float32": 2 | 32 << 8 | 1 << 16, "uint32": 1 | 32 << 8 | 1 << 16,
               "int32": 0 | 32 << 8 | 1 << 16}


def _executor_probe() -> bytes:
    """The module the browser's executor validates to tell relaxed SIMD (a function returning
    f32x4.relaxed_madd of three vectors), read from web/src/wasm_executor.ts."""
    source = (HERE.parents[1] / "web" / "src" / "wasm_executor.ts").read_text()
    body = re.search(r"const RELAXED_SIMD_PROBE = new Uint8Array\(\[(.*?)\]\);", source, re.S)
    return bytes(int(h, 16) for h in re.findall(r"0x[0-9a-f]{2}", body.group(1)))


RELAXED_PROBE = _executor_probe()


@functools.cache
def node_with_relaxed_simd() -> tuple[str, ...] | None:
    """node, with relaxed SIMD on (a flag before V8 11.4 / node 22, on by default after), or
    None where this node cannot run it."""
    for cmd in (("node",), ("node", "--experimental-wasm-relaxed-simd")):
        done = subprocess.run([*cmd, "-e", "process.exit(WebAssembly.validate(new Uint8Array("
                               + json.dumps(list(RELAXED_PROBE)) + ")) ? 0 : 3)"])
        if done.returncode == 0:
            return cmd
    return None


def call(wasm: Path, function: str, args: list[np.ndarray], tmp: Path,
         node: tuple[str, ...] = ("node",), repeat: int = 0) -> tuple[dict, list]:
    """Run ``function`` of the module on ``args`` (outputs included), and ``repeat`` more times
    to time it; (its answer: rc, error, the timed calls' mean ms; the args after the calls)."""
    spec = {"function": function, "repeat": repeat, "args": []}
    for k, a in enumerate(args):
        path = tmp / f"arg{k}.bin"
        path.write_bytes(np.ascontiguousarray(a).tobytes())
        spec["args"].append({"file": str(path), "dtype_word": DTYPE_WORDS[str(a.dtype)],
                             "shape": list(a.shape)})
    (tmp / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([*node, str(HERE / "wasm_call.mjs"), str(wasm), str(tmp / "spec.json")],
                          capture_output=True, text=True, check=True)
    out = [np.frombuffer((tmp / f"arg{k}.bin").read_bytes(), dtype=a.dtype).reshape(a.shape)
           for k, a in enumerate(args)]
    return json.loads(done.stdout), out
