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


def isolated_static(directory: str):
    """A Starlette app serving ``directory`` as a cross-origin isolated page may use it:
    COEP on every file (a dedicated worker's script needs it: onnxruntime-web's threaded
    worker is refused without) and CORP same-origin."""
    from fastapi.staticfiles import StaticFiles

    files = StaticFiles(directory=directory, follow_symlink=True)
    extra = [(b"cross-origin-embedder-policy", b"require-corp"),
             (b"cross-origin-resource-policy", b"same-origin")]

    async def app(scope, receive, send):
        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await files(scope, receive, send_with_headers)

    return app
