"""What a compiled thing depends on besides its inputs: the compiler's own source and TVM's
version. Artifacts (compiler/compile.py ``cache_key``) and built kernel sets
(compiler/targets/build_cache.py) are rebuilt whenever either changes."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
REGISTRY = HERE / "registry.json"


# Bump on a format change; the source digest below catches every other compiler change.
COMPILER_REVISION = 3
TARGET = "webgpu"  # the target a compile lowers for (compiler/compile.py)


def tvm_version() -> str:
    """TVM's version, from its distribution's metadata when it has one (importing TVM takes
    seconds: `wick list` asks too), else from the module."""
    from importlib import metadata

    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:  # (a TVM built from source)
        import tvm

        return tvm.__version__


def compiler_stamp() -> dict:
    """What a manifest records of the compiler that built it: an artifact whose stamp is not
    this install's was built by another compiler, and compile.py's ``cache_key`` never names
    it again."""
    from .._version import __version__

    return {"wick": __version__, "revision": COMPILER_REVISION, "digest": compiler_digest(),
            "tvm": tvm_version(), "target": TARGET}


def compiler_digest() -> str:
    """Hash of the compiler's own source: artifacts are rebuilt whenever the compiler changes."""
    return _digest(_stamps())


def _stamps() -> tuple:
    # (and what reaches the manifest from elsewhere: the sampling keys a request takes, and the
    # registry's model cards only: another pin or size there rebuilds nothing)
    extra = [HERE / "kernel_runtime.c", HERE.parent / "engine" / "artifact.py",
             HERE.parent / "engine" / "sampling_defaults.py"]
    paths = [p for p in sorted(HERE.rglob("*.py")) + extra if p.is_file()]
    # (read again only when a file changed: a compile asks several times)
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size)
                 for p in [*paths, REGISTRY])


@functools.lru_cache(maxsize=4)
def _digest(stamps: tuple) -> str:
    digest = hashlib.sha256()
    for path, _, _ in stamps[:-1]:
        digest.update(Path(path).read_bytes())
    cards = json.loads(REGISTRY.read_text(encoding="utf-8"))
    digest.update(json.dumps({name: entry.get("sampling") for name, entry in cards.items()},
                             sort_keys=True).encode())
    return digest.hexdigest()[:16]
