"""Built kernel sets kept between compiles, keyed by what the build reads.

An LLVM build of a model's kernels (CPU, WebAssembly) takes seconds to tens of seconds, and
its input is often one an earlier compile already built: the same model compiled again with
another context window, batch size or shard size lowers to the same TIR functions (their
bounds are arguments), and so do models of the same shapes. ``built(...)`` returns such a set
from ``<WICK_HOME>/kernel-builds/`` instead of building it again.

The key is every input of the build: the set's name, each function's TVMScript text, what the
target module says its build depends on besides them (``build_facts()``: the host CPU and its
flags, the linker, zig's version), TVM's version and the compiler's source digest. A build is
deterministic in those (tested: the same bytes built twice), so a hit is what the build would
have written; each file's sha256 is checked when read, and a damaged entry is built again.

``WICK_KERNEL_CACHE``: another directory for it, or ``off`` to build every time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..paths import wick_home
from ..source_digest import compiler_digest, tvm_version
from .built import BuiltSet, digest

KEEP = 48  # entries kept, the most recently used (a tiny model's: ~1 MB; SmolLM2's: ~3 MB)
INDEX = "built.json"
OFF = ("0", "off", "false", "no")
STALE_S = 3600  # an unfinished write older than this is a killed compile's
log = logging.getLogger("wick.compiler")


def cache_root() -> Path | None:
    """Where built sets are kept; None when ``WICK_KERNEL_CACHE`` turns the cache off."""
    explicit = os.environ.get("WICK_KERNEL_CACHE", "").strip()
    if explicit.lower() in OFF:
        return None
    return Path(explicit).expanduser() if explicit else wick_home() / "kernel-builds"


def tvm_versions() -> list:
    """TVM's version and its FFI's (pinned apart: another FFI may pass arguments otherwise)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ffi = version("apache-tvm-ffi")
    except PackageNotFoundError:
        ffi = None
    return [tvm_version(), ffi]


def build_key(name: str, functions: dict, facts: dict) -> str:
    """The key of building ``functions`` (name -> TIR PrimFunc) as set ``name``."""
    h = hashlib.sha256(json.dumps({"set": name, "facts": facts, "tvm": tvm_versions(),
                                   "compiler": compiler_digest()}, sort_keys=True).encode())
    for fname in sorted(functions):
        h.update(b"\0" + fname.encode() + b"\0" + functions[fname].script().encode())
    return h.hexdigest()[:32]


def built(name: str, build: Callable, facts: Callable[[], dict], lowered) -> dict[str, BuiltSet]:
    """``build(lowered)``, or the same result kept from an earlier compile."""
    root = cache_root()
    if root is None:
        return build(lowered)
    key = build_key(name, lowered.functions, facts())
    found = _read(root / key)
    if found is not None:
        log.info("kernel set %s: reused the build %s from %s", name, key, root)
        return found
    out = build(lowered)
    try:
        _write(root, key, out)
    except OSError as err:  # (a full or read-only disk: the compile goes on without it)
        log.warning("kernel set %s: could not keep its build in %s: %s", name, root, err)
    return out


def _read(entry: Path) -> dict[str, BuiltSet] | None:
    try:
        index = json.loads((entry / INDEX).read_text())
        out = {}
        for kind, item in index.items():
            files = {}
            for i, (path, sha) in enumerate(item["files"]):
                data = (entry / f"{kind}.{i}").read_bytes()
                if digest(data) != sha:
                    raise ValueError(f"{path} does not match its hash")
                files[path] = data
            out[kind] = BuiltSet(files, item["entry"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        log.warning("kernel build cache entry %s is damaged (%s): building again", entry, err)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    try:
        os.utime(entry)  # (most recently used: kept longest)
    except OSError:  # (pruned meanwhile by another compile, or a cache we may only read)
        pass
    return out


def _write(root: Path, key: str, sets: dict[str, BuiltSet]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        index = {}
        for kind, got in sets.items():
            index[kind] = {"entry": got.entry,
                           "files": [[path, digest(data)] for path, data in got.files.items()]}
            for i, data in enumerate(got.files.values()):
                (tmp / f"{kind}.{i}").write_bytes(data)
        (tmp / INDEX).write_text(json.dumps(index))
        try:
            tmp.rename(root / key)  # (atomic: a reader sees a whole entry or none)
        except OSError:
            if not (root / key / INDEX).is_file():  # (not another process's same build)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(root)


def _prune(root: Path) -> None:
    entries, now = [], time.time()
    for path in root.iterdir():
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:  # (pruned by another process meanwhile)
            continue
        if not path.name.startswith("."):
            entries.append((mtime, path))
        elif now - mtime > STALE_S:  # (a write a killed compile left)
            shutil.rmtree(path, ignore_errors=True)
    for _, path in sorted(entries, reverse=True)[KEEP:]:
        shutil.rmtree(path, ignore_errors=True)
