"""The artifact schema: the one definition the compiler writes and every engine reads.

An artifact is a directory (docs/artifact.md):

    wick-artifact.json        manifest: model config, quantization, tokenizer, kernel sets,
                              plans, parameter index, shards with sha256
    kernels/webgpu/*.wgsl     one WGSL module per kernel (the "webgpu" kernel set)
    kernels/<kind>/...        the other kernel sets, one file each (cpu, wasm, cuda)
    params/shard-NNNNN.bin    raw little-endian tensors, <= 32 MiB per shard
    tokenizer.json            HF tokenizers format

Reading needs only the standard library (it runs in Pyodide too); file access goes through a
``read(relative_path) -> bytes`` callable so that the browser can serve it from its cache.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Callable, Collection, Iterator

from .errors import ArtifactError

FORMAT_VERSION = 2  # 2: the kernel sets in one shape (``kernel_sets``)
MANIFEST_NAME = "wick-artifact.json"
# The WebAssembly kernel sets, as compiler/targets/wasm.py ``MODULES`` builds them: one thread or
# helper threads over a shared memory, plain SIMD or relaxed SIMD (a browser's executor runs the
# one its features allow: web/src/wasm_executor.ts ``libraries``)
WASM_KINDS = ("wasm", "wasm_threads", "wasm_relaxed", "wasm_threads_relaxed")
SHARD_MAX_BYTES = 32 << 20
PARAM_ALIGN = 256  # parameter offsets inside a shard
# Left in an artifact directory by a host whose load found a corrupt file: the next compile of
# the same model checks every hash (not only sizes) before reusing it, and rebuilds it if broken.
VERIFY_MARKER = ".verify-hashes"


@dataclass(frozen=True, slots=True)
class ParamEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard: int  # -1: no stored bytes, ``fill`` says how the device fills it
    offset: int  # bytes into the shard
    nbytes: int
    fill: tuple[float, float, float] | None = None  # synthetic weights: seed, low, high


class Artifact:
    """A parsed manifest plus a way to read the artifact's files."""

    def __init__(self, manifest: dict, read: Callable[[str], bytes], location: str = "") -> None:
        fmt = manifest.get("format")
        if fmt != FORMAT_VERSION:
            raise ArtifactError(
                f"artifact {location or manifest.get('model_id')} has format {fmt}, this wick reads "
                f"format {FORMAT_VERSION}: recompile it with `wick compile`"
            )
        self.manifest = manifest
        self.read = read
        self.location = location
        self.params = [
            ParamEntry(p["name"], tuple(p["shape"]), p["dtype"], p.get("shard", -1),
                       p.get("offset", 0), p["nbytes"],
                       tuple(p["fill"]) if "fill" in p else None)
            for p in manifest["params"]
        ]

    @classmethod
    def load(cls, read: Callable[[str], bytes], location: str = "") -> "Artifact":
        try:
            manifest = json.loads(read(MANIFEST_NAME))
        except FileNotFoundError:
            raise ArtifactError(f"{location or 'artifact'}: {MANIFEST_NAME} is missing") from None
        except ValueError as e:
            raise ArtifactError(f"{location or 'artifact'}: {MANIFEST_NAME} is not valid JSON: {e}") from None
        return cls(manifest, read, location)

    @property
    def model_id(self) -> str:
        return self.manifest["model_id"]

    @property
    def quantization(self) -> str:
        return self.manifest["quantization"]

    @property
    def model(self) -> dict:
        return self.manifest["model"]

    @property
    def required_features(self) -> list[str]:
        return list(self.manifest.get("requires", {}).get("features", []))

    @property
    def fallback_variants(self) -> list[str]:
        """Variants of the same weights that run without ``required_features`` (the compiler
        names them)."""
        return list(self.manifest.get("requires", {}).get("fallback", []))

    def kernel_set(self, kind: str) -> dict:
        """The manifest's kernel set for a backend kind (engine/backend.py), or an error naming
        what to do when the artifact was compiled without it."""
        entry = self.manifest["kernel_sets"].get(kind)
        if entry is None:
            what = ("WebAssembly" if kind in WASM_KINDS else
                    {"cpu": "CPU", "cuda": "CUDA", "webgpu": "WebGPU"}.get(kind, kind))
            name = self.location or self.model_id
            chosen = (self.manifest.get("compile_options") or {}).get("kernel_sets")
            if chosen:  # (compiled with `--kernel-sets`: its own choice, not a stale artifact)
                raise ArtifactError(
                    f"artifact {name} has no {what} kernels: it was compiled with "
                    f"--kernel-sets {','.join(chosen)}; compile it again without --kernel-sets "
                    f"(or with {'wasm_relaxed' if kind.endswith('_relaxed') else kind.split('_')[0]}"
                    " among them)", code="kernel_set_missing")
            raise ArtifactError(f"artifact {name} has no {what} kernels "
                                "(compiled by an older wick, or without them): recompile it with "
                                "`wick compile --force`", code="artifact_stale")
        return entry

    def kernels(self, names: Collection[str] | None = None) -> list[dict]:
        """The WebGPU set's kernel metadata with the WGSL source filled in (``wgsl``), verified
        by sha256; only those in ``names`` when given."""
        out = []
        for k in self.kernel_set("webgpu")["kernels"]:
            if names is not None and k["name"] not in names:
                continue
            src = self.read_verified(k["file"], k["sha256"])
            out.append({**k, "wgsl": src.decode("utf-8")})
        return out

    def read_verified(self, path: str, sha256: str) -> bytes:
        data = self.read(path)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ArtifactError("corrupt (sha256 mismatch): download it again, or compile the "
                                "model again (`wick compile` rebuilds a corrupt artifact)",
                                path=f"{self.location}/{path}" if self.location else path,
                                code="artifact_corrupt")
        return data

    def shard_bytes(self) -> Iterator[tuple[int, bytes]]:
        for i, shard in enumerate(self.manifest["shards"]):
            yield i, self.read_verified(shard["file"], shard["sha256"])

    def tokenizer_json(self) -> str:
        tok = self.manifest["tokenizer"]
        return self.read_verified(tok["file"], tok["sha256"]).decode("utf-8")


# ------------------------------------------------------------------ kernel sets

# How a kernel set is kept (its entry's "form"); engine/plan.py has a table class per form:
#   "shaders": one file per kernel (``kernels``: WGSL modules), launched per ``tir_functions``
#   "source":  one source file the backend compiles at load (CUDA C), launched the same way
#   "library": one compiled library (native CPU, WebAssembly) holding each TIR function whole
FORMS = ("shaders", "source", "library")


def kernel_files(entry: dict) -> list[dict]:
    """The files of one kernel set (``{"file", "sha256", ...}`` each): what a host serves, an
    export copies, a reuse check hashes, and the browser fetches for its backend."""
    return [entry] if "file" in entry else list(entry["kernels"])


# ------------------------------------------------------------------ the CPU kernel set's host

# x86 flags that name instruction sets LLVM may emit (the rest of /proc/cpuinfo's flags tell
# of the kernel, the hypervisor and the timers: a bare-metal machine lacks "hypervisor")
_X86_ISA = re.compile(r"(sse\w*|ssse3|pni|avx\w*|fma4?|f16c|bmi[12]|popcnt|abm|movbe|adx|aes|vaes"
                      r"|v?pclmulqdq|gfni|sha_ni|amx\w*|cx16|xop|tbm|lm)")


def host_cpu_flags() -> frozenset[str]:
    """The instruction-set features this machine's CPU reports (Linux: /proc/cpuinfo's
    ``flags`` on x86, ``Features`` on Arm); empty where the OS does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(v for v in value.split() if _X86_ISA.fullmatch(v))
                if key.strip() == "Features":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


# A CPU kernel set's "runtime": the ABI of the kernel runtime linked into it
# (compiler/kernel_runtime.c; native/cpu_backend.py calls wick_init, wick_set_threads,
# wick_use_pool, wick_error). The compiler writes it, the backend runs only this one.
KERNEL_RUNTIME_ABI = 1


def cpu_kernels_misfit(entry: dict) -> str | None:
    """Why this machine cannot run a CPU kernel set (manifest ``kernel_sets.cpu``), or None.

    The compiler records the features of the CPU it compiled for (``cpu_flags``): LLVM may use
    any of them, so a machine lacking one could stop on an illegal instruction. A machine with
    all of them runs the set, whatever its CPU's name (``mcpu`` only tunes)."""
    if entry.get("runtime") is None:
        return ("its CPU kernels need TVM's runtime (compiled by an older wick): recompile "
                "the model (`wick compile --force`)")
    if entry["runtime"] != KERNEL_RUNTIME_ABI:
        return (f"its CPU kernels were linked with kernel runtime {entry['runtime']!r}, and this "
                f"wick runs {KERNEL_RUNTIME_ABI}: recompile the model with this wick "
                "(`wick compile --force`)")
    wanted = frozenset(entry.get("cpu_flags") or ())
    have = host_cpu_flags()
    if wanted and have:
        missing = sorted(wanted - have)
        if missing:
            shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
            return (f"its CPU kernels were built for {entry.get('mcpu')!r}, and this CPU lacks "
                    f"{shown}: recompile the model on this machine (`wick compile --force`)")
    return None
