"""hf:// models end to end, from a loopback stand-in of the Hub (tests/hub_standin.py). The
parity with transformers of a bf16 safetensors repo (Qwen2) and a GGUF inside a repo (Llama 3)
is test_families.py's (its models come through the hub, conftest.hub_models); here: what their
artifacts record, the CLI with HF_ENDPOINT (and its one-line errors), and a repo holding a
compiled artifact, run as it is (a damaged one refused)."""

from __future__ import annotations

import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.conftest import ROOT, wick_process_env
from tests.e2e.family_models import HUB_REPOS
from tests.hub_standin import process_env, using

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hub(hub_models):
    """The session's stand-in Hub, huggingface_hub in this process pointed at it."""
    with ExitStack() as stack:
        stack.enter_context(using(hub_models, hub_models.cache))
        yield hub_models


@pytest.mark.parametrize("key", sorted(HUB_REPOS))
def test_an_artifact_records_its_repo_and_commit(hub, compiled_from_hub, key):
    from tests.e2e.helpers import load_artifact

    manifest = load_artifact(compiled_from_hub(key)).manifest
    repo, commit = HUB_REPOS[key], hub.commits[key]
    assert manifest["model_id"] == repo
    file = "/tiny-llama-F32.gguf" if key.startswith("gguf:") else ""
    assert manifest["source"]["model"] == f"hf://{repo}@{commit}{file}"
    assert not hub.asked("GET", "pytorch_model.bin") and not hub.asked("GET", "README.md")


def test_the_cli_compiles_from_the_hub_and_lists_the_source(hub, compiled_from_hub, tmp_path):
    """`wick compile hf://...` in a process of its own (HF_ENDPOINT, its own HF_HOME): the same
    cached artifact as the in-process compile; `wick list` shows where it came from."""
    art_dir = compiled_from_hub("qwen2")
    env = wick_process_env(**process_env(hub, tmp_path / "hf-home"))
    run = subprocess.run(
        [sys.executable, "-m", "wick.server.cli", "compile", "hf://org/tiny-qwen2@main",
         "-q", "q0f32", "--prefill-chunk-size", "128", "--max-batch-size", "8"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip().splitlines()[-1]) == art_dir
    listing = subprocess.run([sys.executable, "-m", "wick.server.cli", "list"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    row = next(line for line in listing.stdout.splitlines() if str(art_dir) in line)
    assert row.split()[0] == "org/tiny-qwen2"
    assert f"hf://org/tiny-qwen2@{hub.commits['qwen2']}" in row


@pytest.mark.parametrize("uri,says", [
    ("hf://org/absent", "error: hf://org/absent: no such model repo on http://127.0.0.1:"),
    ("hf://org/gated", "error: hf://org/gated is a gated model: accept the model's terms at"),
])  # (a missing revision or file, no network: tests/compiler/test_hub.py, the same messages)
def test_cli_errors_are_one_line(hub, tmp_path, uri, says):
    if "gated" in uri and "org/gated" not in hub.repos:
        hub.add("org/gated", {"m.gguf": b"g"})
        hub.gate("org/gated", tokens={"hf_granted"})
    env = wick_process_env(**process_env(hub, tmp_path / "hf-home"))
    run = subprocess.run([sys.executable, "-m", "wick.server.cli", "chat", uri],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
                         input="")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), run.stderr


def test_a_repo_holding_an_artifact_runs_as_it_is(hub, tiny_artifact):
    """A compiled artifact pushed to a repo: Engine("hf://...") runs it without compiling and
    answers as the same artifact on disk does; a repo whose shard differs from its manifest is
    refused; compiling such a repo says it is compiled already."""
    from wick import Engine
    from wick.compiler.compile import compile_model
    from wick.engine.errors import ArtifactError, InvalidRequestError

    files = {p.relative_to(tiny_artifact).as_posix(): p.read_bytes()
             for p in sorted(tiny_artifact.rglob("*")) if p.is_file()}
    hub.add("org/tiny-wick", files)
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    local = Engine(str(tiny_artifact), device="cpu").chat.completions.create(**ask)
    remote = Engine("hf://org/tiny-wick", device="cpu")
    assert remote.artifact_dir.parent.name == "snapshots"  # huggingface_hub's cache, as it is
    assert remote.chat.completions.create(**ask).choices[0].message.content == \
        local.choices[0].message.content
    # `wick serve` hosts it for browsers: the snapshot's files are links into the cache's
    # blobs, served; a link out of the repo's cache is not
    from wick.server.artifact_host import ArtifactHost

    host = ArtifactHost(None)
    served = host.add(remote.artifact_dir)
    shard = next(name for name in files if name.startswith("params/"))
    assert host.resolve(served, shard).path.read_bytes() == files[shard]
    assert host.resolve(served, "kernels/../" + shard) is None
    outside = remote.artifact_dir / "params" / "elsewhere.bin"
    outside.symlink_to(tiny_artifact / shard)
    try:
        assert host.resolve(served, "params/elsewhere.bin") is None
    finally:
        outside.unlink()

    damaged = dict(files)
    damaged[shard] = bytes([files[shard][0] ^ 1]) + files[shard][1:]
    hub.add("org/tiny-wick-damaged", damaged)
    with pytest.raises(ArtifactError, match=f"is damaged: {shard}: sha256 mismatch"):
        Engine("hf://org/tiny-wick-damaged", device="cpu")
    with pytest.raises(InvalidRequestError, match="holds a compiled wick artifact"):
        compile_model("hf://org/tiny-wick", None)


def test_a_registry_entry_may_name_a_hub_repo(hub, compiled_from_hub, monkeypatch):
    """A built-in name whose registry entry is ``{"hf": "hf://..."}`` compiles that repo in the
    entry's default variant (here: the artifact compiled from it before, found by content)."""
    from wick.compiler import sources
    from wick.compiler.compile import compile_model

    from tests.e2e.conftest import TINY_OPTIONS

    registry = {**sources.builtin_models(),
                "tiny-qwen2-instruct": {"hf": "hf://org/tiny-qwen2", "family": "qwen2",
                                        "default_quantization": "q0f32"}}
    monkeypatch.setattr(sources, "builtin_models", lambda: registry)
    # (no variant asked: the entry's default, q0f32)
    assert compile_model("tiny-qwen2-instruct", None, **TINY_OPTIONS) == \
        compiled_from_hub("qwen2")


def test_a_served_model_answers_to_the_name_it_was_served_by():
    """`wick serve hf://org/tiny`: its model id is org/tiny (listed), and a request naming
    hf://org/tiny (what the operator typed) reaches it as well."""
    import asyncio
    from types import SimpleNamespace

    from wick.engine.model_info import model_names
    from wick.server.app import ModelPool

    engine = SimpleNamespace(core=SimpleNamespace(info=SimpleNamespace(
        model_id="org/tiny", quantization="q4f16_1", names=model_names("org/tiny", "q4f16_1"))))
    pool = ModelPool(loaders=[("hf://org/tiny", lambda: engine)])
    asyncio.run(pool.load())
    assert pool.state == "ready" and list(pool.engines) == ["org/tiny"]
    assert all(pool.select(name) is engine
               for name in ("org/tiny", "org/tiny-q4f16_1", "hf://org/tiny"))


def test_a_served_manifest_keeps_an_hf_source_and_cuts_a_local_path():
    import json

    from wick.server.artifact_host import scrub_manifest

    def served(source: str) -> str:
        return json.loads(scrub_manifest(json.dumps({"source": {"model": source}}).encode())
                          )["source"]["model"]

    assert served("hf://org/tiny@" + "a" * 40) == "hf://org/tiny@" + "a" * 40
    assert served("/home/me/models/tiny-qwen2") == "tiny-qwen2"
