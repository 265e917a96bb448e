"""The compile cache keeps nothing half-built and reuses nothing broken: a failed or interrupted
write leaves no ``.tmp-PID`` directory, a killed compile's one is swept, and a cached artifact
is checked (sizes always, every hash after a load found one corrupt) before it is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wick.compiler.artifact_writer import artifact_problems, sweep_stale_builds, write_artifact
from wick.compiler.lower import Lowered
from wick.engine.artifact import MANIFEST_NAME, VERIFY_MARKER


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_failed_write_leaves_no_build_directory(tmp_path):
    def params():
        yield "w", np.zeros(4, np.float32)
        raise OSError("disk full")  # the conversion failed half-way

    lowered = Lowered(plans={}, param_specs={"w": {"shape": [4], "dtype": "float32"}})
    with pytest.raises(OSError, match="disk full"):
        write_artifact(tmp_path / "model-q0f32-1", header={}, lowered=lowered, params=params(),
                       num_params=2, tokenizer_json="{}")
    assert list(tmp_path.iterdir()) == []


def test_sweep_removes_builds_of_dead_processes_only(tmp_path):
    killed = tmp_path / f"model-q0f32-1.tmp-{dead_pid()}"
    running = tmp_path / f"model-q0f32-2.tmp-{os.getpid()}"
    finished = tmp_path / "model-q0f32-3"
    for d in (killed, running, finished):
        (d / "params").mkdir(parents=True)
        (d / "params" / "shard-00000.bin").write_bytes(b"x" * 1000)
    assert sweep_stale_builds(tmp_path) == [killed]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, finished.name])


def fake_artifact(root: Path) -> Path:
    art = root / "model-q0f32-1"
    (art / "params").mkdir(parents=True)
    (art / "kernels").mkdir()
    shard, kernel, tok = os.urandom(4096), b"fn main() {}", b"{}"
    (art / "params" / "shard-00000.bin").write_bytes(shard)
    (art / "kernels" / "k.wgsl").write_bytes(kernel)
    (art / "tokenizer.json").write_bytes(tok)
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    (art / MANIFEST_NAME).write_text(json.dumps({
        "tokenizer": {"file": "tokenizer.json", "sha256": sha(tok)},
        "kernel_sets": {"webgpu": {"form": "shaders",
                                   "kernels": [{"file": "kernels/k.wgsl", "sha256": sha(kernel)}]}},
        "shards": [{"file": "params/shard-00000.bin", "nbytes": len(shard), "sha256": sha(shard)}],
    }))
    return art


def test_artifact_problems_sizes_always_hashes_when_marked(tmp_path):
    art = fake_artifact(tmp_path)
    shard = art / "params" / "shard-00000.bin"
    assert artifact_problems(art) == []
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # same size: only a hash sees it
    shard.write_bytes(bytes(data))
    assert artifact_problems(art) == []
    assert artifact_problems(art, hashes=True) == ["params/shard-00000.bin: sha256 mismatch"]
    (art / VERIFY_MARKER).touch()  # left by a load that found a corrupt file
    assert artifact_problems(art) == ["params/shard-00000.bin: sha256 mismatch"]
    shard.write_bytes(bytes(data[:-1]))  # truncated: sizes always
    (art / VERIFY_MARKER).unlink()
    assert artifact_problems(art) == ["params/shard-00000.bin: 4095 bytes, the manifest says 4096"]
    (art / "kernels" / "k.wgsl").write_bytes(b"fn main() { }")  # small files: always hashed
    assert "kernels/k.wgsl: sha256 mismatch" in artifact_problems(art)
    (art / "tokenizer.json").unlink()
    assert any(p.startswith("tokenizer.json:") for p in artifact_problems(art))


def test_a_compile_waits_for_another_build_of_its_artifact_and_reuses_it(
        tiny_llama_dir, tiny_artifact, tmp_path, caplog):
    """Two compiles of one artifact (replicas starting together) take turns: the second waits
    for the first's build lock, then finds its artifact instead of building it again and
    replacing the directory under the first one's readers."""
    import logging
    import shutil
    import threading
    import time

    from tests.conftest import TINY_SHARD_BYTES, TINY_SMALL
    from wick.compiler.artifact_writer import build_lock
    from wick.compiler.compile import compile_model

    out, stages, result = tmp_path / "art", [], {}

    def second() -> None:
        result["path"] = compile_model(
            str(tiny_llama_dir), "q0f32", output=out, shard_max_bytes=TINY_SHARD_BYTES,
            progress=lambda stage, done, total: stages.append(stage), **TINY_SMALL)

    caplog.set_level(logging.WARNING, logger="wick")
    with build_lock(out):  # the first compile, building
        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 60
        while "another process is compiling it" not in caplog.text:
            assert time.monotonic() < deadline and thread.is_alive(), stages
            time.sleep(0.05)
        shutil.copytree(tiny_artifact, out)  # ... and done
    thread.join(120)
    assert result["path"] == out
    assert stages[-1] == "cached" and "build model" not in stages, stages
    assert artifact_problems(out, hashes=True) == []
