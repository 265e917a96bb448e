"""npm packages the browser benchmarks run beside wick (wllama, transformers.js,
onnxruntime-web), fetched once with ``npm pack`` into build/bench/ and unpacked there."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def npm_package(spec: str, name: str) -> Path:
    """The unpacked package ``spec`` (e.g. ``@wllama/wllama@2.3.1``) under build/bench/name."""
    cache = ROOT / "build" / "bench" / name
    pkg = cache / "package"
    if not (pkg / "package.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"fetching {spec} from the npm registry", flush=True)
        done = subprocess.run(["npm", "pack", spec, "--pack-destination", str(cache)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"npm pack {spec} failed: {done.stderr.strip()[-500:]}")
        with tarfile.open(cache / done.stdout.strip().splitlines()[-1]) as tar:
            tar.extractall(cache, filter="data")
    return pkg
