"""Writes an artifact directory (schema: wick.engine.artifact, docs/artifact.md).

The directory is built under a temporary name and renamed into place at the end, so a crash or
an interrupted compile never leaves something that looks like a finished artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from ..engine.artifact import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    kernel_files,
    PARAM_ALIGN,
    SHARD_MAX_BYTES,
    VERIFY_MARKER,
)

from .targets.built import digest

if TYPE_CHECKING:  # (TVM: the compile extra; this module's checks run without it)
    from .lower import Lowered
    from .targets.built import BuiltSet

Progress = Callable[[str, int, int], None]


class _ShardWriter:
    def __init__(self, root: Path, max_bytes: int = SHARD_MAX_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes
        (root / "params").mkdir(parents=True, exist_ok=True)
        self.shards: list[dict] = []
        self.current = bytearray()

    def add(self, data: bytes) -> tuple[int, int]:
        pad = (-len(self.current)) % PARAM_ALIGN
        if self.current and len(self.current) + pad + len(data) > self.max_bytes:
            self.flush()
            pad = 0
        self.current += b"\0" * pad
        offset = len(self.current)
        self.current += data
        return len(self.shards), offset

    def flush(self) -> None:
        if not self.current:
            return
        name = f"params/shard-{len(self.shards):05d}.bin"
        data = bytes(self.current)
        (self.root / name).write_bytes(data)
        self.shards.append({"file": name, "nbytes": len(data), "sha256": digest(data)})
        self.current = bytearray()


def write_artifact(
    out_dir: Path,
    *,
    header: dict,
    lowered: Lowered,
    params: Iterable[tuple[str, np.ndarray]],
    num_params: int,
    tokenizer_json: str,
    progress: Progress | None = None,
    shard_max_bytes: int = SHARD_MAX_BYTES,
    kernel_sets: dict[str, BuiltSet] | None = None,
    fills: dict[str, list[float]] | None = None,
) -> Path:
    """Write everything under ``out_dir`` (replaced atomically). ``header`` holds model_id,
    quantization, model, requires, source and compiler fields of the manifest; ``lowered``
    gives the plans and the parameters' shapes. A parameter bigger than ``shard_max_bytes``
    gets a shard of its own. ``kernel_sets``: per kind, that set's files and manifest entry
    (compiler/targets/ ``build_all``). ``fills``: parameters without stored weights, each
    filled on the device at load from its [seed, low, high] (compiler/synthetic.py)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f"{TMP_INFIX}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, header=header, lowered=lowered, params=params, num_params=num_params,
               tokenizer_json=tokenizer_json, progress=progress, shard_max_bytes=shard_max_bytes,
               kernel_sets=kernel_sets or {}, fills=fills or {})
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    except BaseException:  # a failed or interrupted build leaves nothing behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write(tmp: Path, *, header: dict, lowered: Lowered, params: Iterable[tuple[str, np.ndarray]],
           num_params: int, tokenizer_json: str, progress: Progress | None,
           shard_max_bytes: int, kernel_sets: dict[str, BuiltSet],
           fills: dict[str, list[float]]) -> None:
    tmp.mkdir(parents=True)
    for built in kernel_sets.values():
        for rel, data in built.files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
    shards = _ShardWriter(tmp, shard_max_bytes)
    index = []
    for i, (name, array) in enumerate(params):
        spec = lowered.param_specs.get(name)
        if spec is None:
            raise ValueError(f"weight {name} is not a parameter of the compiled model")
        if list(array.shape) != spec["shape"] or str(array.dtype) != spec["dtype"]:
            raise ValueError(f"weight {name}: got {array.shape} {array.dtype}, model wants {spec}")
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        shard, offset = shards.add(data)
        index.append({"name": name, "shape": spec["shape"], "dtype": spec["dtype"],
                      "shard": shard, "offset": offset, "nbytes": len(data)})
        if progress:
            progress("write weights", i + 1, num_params)
    shards.flush()
    for name, fill in fills.items():
        spec = lowered.param_specs[name]
        count = int(np.prod(spec["shape"], dtype=np.int64))
        index.append({"name": name, "shape": spec["shape"], "dtype": spec["dtype"],
                      "nbytes": count * np.dtype(spec["dtype"]).itemsize, "fill": fill})
    missing = set(lowered.param_specs) - {p["name"] for p in index}
    if missing:
        raise ValueError(f"no weights for parameters: {', '.join(sorted(missing)[:5])}")
    tok = tokenizer_json.encode("utf-8")
    (tmp / "tokenizer.json").write_bytes(tok)
    manifest = {
        "format": FORMAT_VERSION,
        **header,
        "tokenizer": {"file": "tokenizer.json", "sha256": digest(tok)},
        "kernel_sets": {kind: built.entry for kind, built in kernel_sets.items()},
        "plans": lowered.plans,
        "params": index,
        "shards": shards.shards,
    }
    (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))


# ---------------------------------------------------------------------------------------------
# Builds in progress, and checking a finished artifact before reusing it

TMP_INFIX = ".tmp-"  # "<artifact>.tmp-<pid>": a build in progress (never served or listed)


@contextlib.contextmanager
def build_lock(out_dir: Path, waiting: Callable[[], None] | None = None):
    """Held while ``out_dir`` is checked and built. Two processes compiling one artifact (a
    model's replicas starting together, two servers, a server and ``wick compile``) take turns:
    the second then finds the first's artifact instead of building it again and replacing the
    directory under the first one's readers. ``waiting`` is called when another holds it. An
    ``flock`` (released by the kernel if its holder dies) on a file named after the directory's
    path in the artifacts directory's ``.locks/`` (never beside a ``--output`` of the user's;
    the file stays: deleting it would race with a waiter)."""
    try:
        import fcntl
    except ImportError:  # (no flock here: builds may overlap, each still written atomically)
        yield
        return
    from .paths import artifacts_dir

    out_dir = Path(out_dir).resolve()
    digest = hashlib.sha256(str(out_dir).encode()).hexdigest()[:16]
    try:
        locks = artifacts_dir() / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        f = open(locks / f"{out_dir.name[:80]}-{digest}.lock", "a")
    except OSError:  # (a read-only wick home, compiling to --output elsewhere: no lock)
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sweep_stale_builds(root: Path) -> list[Path]:
    """Remove the ``*.tmp-PID`` build directories under ``root`` whose process is gone (a
    compile that was killed); returns what was removed."""
    removed = []
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return removed
    for entry in entries:
        name, _, pid = entry.name.rpartition(TMP_INFIX)
        if not name or not (pid.isascii() and pid.isdigit()) or not entry.is_dir() or _alive(int(pid)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else
        return True
    return True


def artifact_problems(out_dir: Path, *, hashes: bool = False,
                      sha256: Callable[[Path], str] | None = None) -> list[str]:
    """What is wrong with a finished artifact, cheaply: every listed file present, kernels and
    tokenizer matching their sha256 (small), shards of their listed size; with ``hashes`` (or
    when a load left ``VERIFY_MARKER``) every shard's sha256 too. Empty: reuse it. ``sha256``:
    how to hash a file (default: read it all, every time)."""
    sha256 = sha256 or _file_sha256
    out_dir = Path(out_dir)
    hashes = hashes or (out_dir / VERIFY_MARKER).exists()
    try:
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
        small = [manifest["tokenizer"],
                 *(f for entry in manifest["kernel_sets"].values() for f in kernel_files(entry))]
        shards = list(manifest["shards"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"{MANIFEST_NAME}: unreadable ({err})"]
    problems = []
    for entry, hash_it in [(e, True) for e in small] + [(e, hashes) for e in shards]:
        path = out_dir / entry["file"]
        try:
            size = path.stat().st_size
            if "nbytes" in entry and size != entry["nbytes"]:
                problems.append(f"{entry['file']}: {size} bytes, the manifest says "
                                f"{entry['nbytes']}")
            elif hash_it and sha256(path) != entry["sha256"]:
                problems.append(f"{entry['file']}: sha256 mismatch")
        except OSError as err:
            problems.append(f"{entry['file']}: {err.strerror or err}")
    return problems


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
