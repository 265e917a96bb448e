"""The ``wick`` command line, run as a user runs it: a subprocess per command, on a tiny random
Llama compiled to q0f32 (lavapipe is enough). Plus the /set parser, without a subprocess."""

from __future__ import annotations

import argparse
import json

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import wick_process_env
from wick.engine.errors import InvalidRequestError
from wick.server.chat_cli import parse_settings

pytest.importorskip("wgpu")
pytest.importorskip("tvm")

WICK = Path(sys.executable).with_name("wick")
CHAT_OPTIONS = ("--seed", "0", "--max-tokens", "8")


@pytest.fixture(scope="module")
def wick_env() -> dict[str, str]:
    env = wick_process_env()  # (without torch, as installed for users)
    env["WICK_HOME"] = os.environ["WICK_HOME"]  # the test session's cache (tests/conftest.py)
    env["PYTHONIOENCODING"] = "utf-8"
    # as in a container: the Vulkan loader's Wayland probe must not reach wick's stderr
    env.pop("XDG_RUNTIME_DIR", None)
    return env


def wick(env: dict[str, str], *args: str, stdin: str = "", timeout: float = 300
         ) -> subprocess.CompletedProcess[str]:
    command = [str(WICK)] if WICK.exists() else [
        sys.executable, "-c", "import sys; from wick.server.cli import main; sys.exit(main())"]
    return subprocess.run([*command, *args], input=stdin, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", env=env, timeout=timeout)


@pytest.fixture(scope="module")
def fresh_compile(tiny_llama_dir, tmp_path_factory, wick_env):
    """A first (uncached) ``wick compile`` into a private output directory."""
    out = tmp_path_factory.mktemp("cli-artifact") / "tiny"
    started = time.perf_counter()
    result = wick(wick_env, "compile", str(tiny_llama_dir), "--quantization", "q0f32",
                  "--output", str(out))
    return result, out, time.perf_counter() - started


@pytest.fixture(scope="module")
def artifact(fresh_compile) -> Path:
    result, out, _ = fresh_compile
    assert result.returncode == 0, result.stderr
    return out


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stdout + result.stderr


# --------------------------------------------------------------------------- compile


def test_compile_prints_path_and_shows_progress(fresh_compile):
    result, out, _ = fresh_compile
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [str(out)]
    assert (out / "wick-artifact.json").is_file()
    for stage in ("resolve source", "build model", "lower (TVM)", "write weights"):
        assert stage in result.stderr
    no_traceback(result)
    assert "warning" not in result.stderr.lower()  # TVM's notes never reach the user


def test_second_compile_is_cached(fresh_compile, tiny_llama_dir, wick_env):
    _, out, first_s = fresh_compile
    started = time.perf_counter()
    result = wick(wick_env, "compile", str(tiny_llama_dir), "--quantization", "q0f32",
                  "--output", str(out))
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert "cached" in result.stderr
    assert "lower (TVM)" not in result.stderr  # nothing was rebuilt
    assert elapsed < max(first_s, 20.0)


def test_compile_to_the_cache_then_list(tiny_llama_dir, wick_env):
    from wick.compiler.paths import artifacts_dir

    result = wick(wick_env, "compile", str(tiny_llama_dir), "--quantization", "q0f32")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.parent == artifacts_dir() and (path / "wick-artifact.json").is_file()
    listed = wick(wick_env, "list")
    assert listed.returncode == 0
    line = next(line for line in listed.stdout.splitlines() if line.endswith(str(path)))
    assert "q0f32" in line and re.search(r"\d+(\.\d+)? [KM]iB", line)
    assert f" {tiny_llama_dir.resolve()} " in line  # SOURCE: what it was compiled from


def test_compile_builds_only_the_kernel_sets_asked_for(tiny_llama_dir, wick_env, tmp_path):
    """``--kernel-sets webgpu``: the WGSL kernels alone; a backend without its set refuses the
    artifact naming the option, and ``device="auto"`` (the CPU on a machine without a GPU)
    runs it on WebGPU instead. An artifact without a browser set is not exported."""
    from tests.e2e.helpers import load_artifact
    from wick.engine.errors import ArtifactError, WickError
    from wick.server.export import browser_files
    from wick.server.local import load_local

    bad = wick(wick_env, "compile", str(tiny_llama_dir), "--kernel-sets", "cpu,metal")
    assert bad.returncode != 0 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "error: unknown kernel set metal: choose from webgpu, cpu, wasm, wasm_relaxed, cuda "
        "(comma-separated)"]
    small = ("-q", "q0f32", "--prefill-chunk-size", "64", "--max-batch-size", "4")
    arts = {}
    for sets in ("webgpu", "cuda"):
        out = tmp_path / sets
        result = wick(wick_env, "compile", str(tiny_llama_dir), *small, "--kernel-sets", sets,
                      "--output", str(out))
        assert result.returncode == 0, result.stderr
        arts[sets] = art = load_artifact(out)
        assert set(art.manifest["kernel_sets"]) == {sets}
        assert [p.name for p in (out / "kernels").iterdir()] == [sets]
    with pytest.raises(ArtifactError) as e:
        arts["webgpu"].kernel_set("cpu")
    assert e.value.code == "kernel_set_missing" and "--kernel-sets webgpu" in e.value.message
    core, _ = load_local(str(tmp_path / "webgpu"), device="auto", kv_cache_bytes=1 << 20)
    assert core.runner.backend.kind == "webgpu"
    core.runner.backend.close()
    assert browser_files(arts["webgpu"].manifest)  # (what `wick export` and the extension ship)
    with pytest.raises(WickError, match="a browser runs webgpu or wasm") as e:
        browser_files(arts["cuda"].manifest)
    assert e.value.code == "kernel_set_missing" and e.value.status == 400


def write_tiny_gguf(path: Path) -> bytes:
    """A small well-formed GGUF (llama metadata, two tensors); returns its bytes."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).random((64, 1024), np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def corrupt_inputs(base: Path, tiny_llama_dir: Path) -> dict[str, Path]:
    import struct

    good = write_tiny_gguf(base / "good.gguf")
    files = {"bad magic": base / "magic.gguf", "truncated": base / "truncated.gguf",
             "absurd shape": base / "absurd.gguf"}
    files["bad magic"].write_bytes(b"NOTAGGUF" + good[8:])
    files["truncated"].write_bytes(good[: len(good) // 2])
    absurd = bytearray(good)
    at = good.index(b"token_embd.weight") + len(b"token_embd.weight") + 4  # past n_dims
    struct.pack_into("<QQ", absurd, at, 1 << 40, 1 << 40)
    files["absurd shape"].write_bytes(bytes(absurd))
    hf = base / "bogus-safetensors"
    shutil.copytree(tiny_llama_dir, hf)
    (hf / "model.safetensors").write_bytes((1 << 60).to_bytes(8, "little") + b"{not json")
    files["bogus safetensors header"] = hf
    return files


def test_compile_of_corrupt_inputs_is_one_error_line(tiny_llama_dir, wick_env, tmp_path):
    for what, path in corrupt_inputs(tmp_path, tiny_llama_dir).items():
        result = wick(wick_env, "compile", str(path), "--quantization", "q0f32",
                      "--output", str(tmp_path / "out"))
        assert result.returncode == 1, (what, result.stderr)
        no_traceback(result)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (what, result.stderr)
        assert path.name in errors[0], (what, errors[0])
        assert not (tmp_path / "out").exists()
    debug = wick(wick_env, "--debug", "compile", str(tmp_path / "truncated.gguf"))
    assert debug.returncode == 1 and "Traceback" in debug.stderr  # --debug shows it


def test_compile_of_an_absurd_config_names_the_field(tiny_llama_dir, wick_env, tmp_path):
    """The outside probe's config (num_hidden_layers 1e9, hidden_size -4) blamed the weights
    file; the error now names config.json and the field (the other rules: in-process, in
    tests/compiler/test_sources.py)."""
    import json

    hf = tmp_path / "absurd"
    shutil.copytree(tiny_llama_dir, hf)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "hidden_size": -4}).replace(
        f'"num_hidden_layers": {config["num_hidden_layers"]}', '"num_hidden_layers": 1e9'))
    result = wick(wick_env, "compile", str(hf), "--quantization", "q0f32",
                  "--output", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    no_traceback(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert f"{hf / 'config.json'}: 'hidden_size' is -4; it must be a whole number from 1 to " \
        "65536" in errors[0], errors[0]
    assert "model.safetensors" not in errors[0] and not (tmp_path / "out").exists()


def test_killed_compile_leaves_nothing_in_the_cache(wick_env):
    from wick.compiler.paths import artifacts_dir

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = artifacts_dir() / f"tiny-q0f32-0000.tmp-{proc.pid}"  # a compile killed with -9
    (stale / "params").mkdir(parents=True)
    (stale / "params" / "shard-00000.bin").write_bytes(b"\0" * 4096)
    result = wick(wick_env, "list")
    assert result.returncode == 0 and not stale.exists()


def test_compile_rebuilds_a_damaged_cached_artifact(artifact, tiny_llama_dir, wick_env, tmp_path):
    """Sizes are checked on every cache hit; a load that finds a bad hash marks the artifact,
    and the next compile checks every hash and rebuilds it. So is an artifact whose CPU kernels
    this machine cannot run (the cache key names no CPU)."""
    import json

    out = tmp_path / "art"
    shutil.copytree(artifact, out)  # what this compile wrote (a compile of its own: 15 s)
    args = ("compile", str(tiny_llama_dir), "--quantization", "q0f32", "--output", str(out))
    result = wick(wick_env, *args)
    assert result.returncode == 0 and "cached" in result.stderr, result.stderr
    shard_entry = json.loads((out / "wick-artifact.json").read_text())["shards"][0]
    shard = out / shard_entry["file"]
    good = shard.read_bytes()

    shard.write_bytes(good[:-10])  # truncated
    result = wick(wick_env, *args)
    assert result.returncode == 0 and result.stderr.count("is damaged") == 1, result.stderr
    assert "lower (TVM)" in result.stderr and shard.read_bytes() == good

    flipped = bytearray(good)
    flipped[1000] ^= 0xFF
    shard.write_bytes(bytes(flipped))  # same size: the cheap check cannot see it ...
    assert "cached" in wick(wick_env, *args).stderr
    chat = wick(wick_env, "chat", str(out), "--max-tokens", "2", stdin="hi\n")
    assert chat.returncode == 1 and "sha256 mismatch" in chat.stderr  # ... the load does
    assert "wick compile" in chat.stderr and (out / ".verify-hashes").exists()
    no_traceback(chat)
    result = wick(wick_env, *args)
    assert "is damaged" in result.stderr and shard.read_bytes() == good
    assert not (out / ".verify-hashes").exists()

    # a cache moved from a machine with more CPU features: rebuilt, not refused at load
    manifest_path = out / "wick-artifact.json"
    manifest = json.loads(manifest_path.read_text())
    here = list(manifest["kernel_sets"]["cpu"]["cpu_flags"])
    manifest["kernel_sets"]["cpu"].update(cpu_flags=[*here, "avx9000"], mcpu="zen9")
    manifest_path.write_text(json.dumps(manifest))
    result = wick(wick_env, *args)
    assert result.returncode == 0 and result.stderr.count("cannot run here") == 1, result.stderr
    assert "lacks avx9000" in result.stderr and "lower (TVM)" in result.stderr
    rebuilt = json.loads(manifest_path.read_text())["kernel_sets"]["cpu"]
    assert rebuilt["cpu_flags"] == here and rebuilt["mcpu"] != "zen9"


def test_load_rebuilds_a_corrupt_artifact_it_compiled(tiny_llama_dir, wick_env):
    """`wick chat SOURCE` on a cached artifact whose shard went bad rebuilds it and answers."""
    import json

    compiled = wick(wick_env, "compile", str(tiny_llama_dir), "--quantization", "q0f32")
    out = Path(compiled.stdout.strip())
    shard = out / json.loads((out / "wick-artifact.json").read_text())["shards"][0]["file"]
    good = shard.read_bytes()
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    chat = wick(wick_env, "chat", str(tiny_llama_dir), "-q", "q0f32", "--max-tokens", "2",
                "--temperature", "0", stdin="hi\n")
    assert chat.returncode == 0, chat.stderr
    assert "rebuilding the artifact" in chat.stderr
    assert shard.read_bytes() == good
    no_traceback(chat)


# --------------------------------------------------------------------------- chat


CHAT_SCRIPT = "\n".join([
    "hello", "/stats", "/set temperature=0;max_tokens=5", "again", "/stats", "/set bogus=1",
    "/set top_p=3", "/nope", "/reset", "hi", "/stats", "/exit", "never sent",
]) + "\n"


def stats_blocks(stdout: str) -> list[tuple[int, int]]:
    """(prompt tokens, completion tokens) of each /stats output."""
    prefill = re.findall(r"^prefill: [\d.]+ tok/s \((\d+) tokens", stdout, re.M)
    decode = re.findall(r"^decode: +[\d.]+ tok/s \((\d+) tokens", stdout, re.M)
    assert len(prefill) == len(decode)
    return [(int(p), int(d)) for p, d in zip(prefill, decode)]


def test_chat_session(artifact, wick_env):
    result = wick(wick_env, "chat", str(artifact), *CHAT_OPTIONS, stdin=CHAT_SCRIPT)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    out = result.stdout
    lines = out.splitlines()
    assert re.fullmatch(r"wick chat: .+ \(q0f32\) on .+; sampling defaults: temperature 0.8, "
                        r"top_p 0.9, top_k 40, repetition_penalty 1.1 \(interactive: the model "
                        r"gives none\)", lines[0])
    assert "/help" in lines[1]
    if "llvmpipe" in lines[0]:  # a software adapter is named as such, once
        assert result.stderr.count("is a software GPU") == 1
    # the first reply is the text between the hint line and the first /stats output
    first_reply = out.split("\n", 2)[2].split("\nprefill:")[0]
    assert first_reply.strip()
    stats = stats_blocks(out)
    assert len(stats) == 3
    (p1, c1), (p2, c2), (p3, c3) = stats
    assert 1 <= c1 <= 8 and 1 <= c2 <= 5 and 1 <= c3 <= 5
    assert p2 > p1 + c1 - 1  # the history (question and reply) went into the second prompt
    assert p3 < p2  # /reset dropped it
    assert re.search(r"host ms per decode step .*engine [\d.]+, plan [\d.]+, backend [\d.]+",
                     out)
    assert re.search(r"^sampling: .*max_tokens=5.*temperature=0\.0", out, re.M)
    assert "history cleared" in out
    assert "error: unknown setting 'bogus'" in result.stderr
    assert "error: Invalid value for 'top_p'" in result.stderr
    assert "error: unknown command /nope" in result.stderr
    assert "never sent" not in out  # /exit stopped reading


def test_chat_greedy_is_deterministic(artifact, wick_env):
    runs = [wick(wick_env, "chat", str(artifact), "--temperature", "0", "--max-tokens", "12",
                 stdin="hello there\n") for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    replies = [r.stdout.split("\n", 2)[2] for r in runs]
    assert replies[0].strip() and replies[0] == replies[1]


def test_chat_with_a_base_model_continues_one_text(tmp_path_factory, wick_env):
    """No chat template: `wick chat` says it is in completion mode, each line extends one text
    the model continues (so the second prompt holds the first line and its continuation)."""
    from tests.tiny_models import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-base"), "llama", seed=5,
                           chat_template=None)
    script = "Once upon a time\nthe end\n/stats\n/reset\nagain\n/stats\n/exit\n"
    result = wick(wick_env, "chat", str(path), "--quantization", "q0f32", "--temperature", "0",
                  "--max-tokens", "6", stdin=script)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    assert "completion mode" in result.stdout
    (second, c2), (again, c3) = stats_blocks(result.stdout)
    # byte-level vocabulary: "Once upon a time" (16) + its reply + "\n" + "the end" (7)
    assert second >= 16 + 1 + 1 + 7 and c2 >= 1 and c3 >= 1
    assert again < 16  # /reset started a new text: "again"
    assert "error" not in result.stderr


def test_chat_bad_sampling_option_is_one_line(artifact, wick_env):
    result = wick(wick_env, "chat", str(artifact), "--temperature", "5")
    assert result.returncode == 1
    # before the model loads: nothing else on stderr (no progress of a load)
    assert result.stderr.strip().splitlines() == [
        "error: Invalid value for 'temperature': 5.0; it must be between 0 and 2."]
    no_traceback(result)


# --------------------------------------------------------------------------- errors, rm, misc


@pytest.mark.parametrize("command", ["compile", "chat"])
def test_unknown_model_is_one_line_error(command, wick_env):
    result = wick(wick_env, command, "no-such-model-xyz")
    assert result.returncode != 0
    no_traceback(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-such-model-xyz" in errors[0]


def test_rm_removes_only_artifacts_in_the_cache(artifact, wick_env, tmp_path):
    from wick.compiler.paths import artifacts_dir

    name = f"cli-rm-test-{uuid.uuid4().hex[:8]}"
    copy = artifacts_dir() / name
    shutil.copytree(artifact, copy)
    assert str(copy) in wick(wick_env, "list").stdout

    outside = wick(wick_env, "rm", str(artifact))  # a real artifact, but outside the cache
    assert outside.returncode == 1 and "refusing" in outside.stderr
    assert artifact.is_dir()
    escape = wick(wick_env, "rm", str(artifacts_dir() / ".." / "artifacts"))
    assert escape.returncode == 1 and artifacts_dir().is_dir()
    missing = wick(wick_env, "rm", "no-such-artifact")
    assert missing.returncode == 1 and "wick list" in missing.stderr

    removed = wick(wick_env, "rm", name)
    assert removed.returncode == 0, removed.stderr
    assert not copy.exists()
    assert str(copy) not in wick(wick_env, "list").stdout


def test_list_marks_stale_artifacts_and_rm_stale_deletes_only_those(artifact, wick_env,
                                                                    tmp_path):
    """An artifact another compiler built (its manifest's stamp differs: a wick upgrade, an
    edited compiler) is never named again by a compile: `wick list` says so, and `wick rm
    --stale` frees it, leaving the current ones."""
    from wick.compiler.source_digest import compiler_stamp

    env = {**wick_env, "WICK_HOME": str(tmp_path / "home")}  # (its own cache: rm --stale)
    cache = tmp_path / "home" / "artifacts"
    current, stale = cache / "tiny-current", cache / "tiny-stale"
    shutil.copytree(artifact, current)
    shutil.copytree(artifact, stale)
    manifest = json.loads((stale / "wick-artifact.json").read_text())
    assert manifest["compiler"] == compiler_stamp()  # (the session's compile: current)
    manifest["compiler"]["digest"] = "0" * 16
    (stale / "wick-artifact.json").write_text(json.dumps(manifest))

    listed = wick(env, "list")
    assert listed.returncode == 0, listed.stderr
    state = {Path(line.split()[-1]).name: line.split()[-2] for line in listed.stdout.splitlines()[1:]}
    assert state == {"tiny-current": "current", "tiny-stale": "stale"}
    assert "1 stale artifact(s)" in listed.stderr and "wick rm --stale" in listed.stderr

    both = wick(env, "rm", "--stale", "tiny-current")
    assert both.returncode == 1 and both.stderr.startswith("error: ") and current.is_dir()
    neither = wick(env, "rm")
    assert neither.returncode == 1 and "--stale" in neither.stderr
    removed = wick(env, "rm", "--stale")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.split() == ["removed", str(stale)] and "freed" in removed.stderr
    assert not stale.exists() and (current / "wick-artifact.json").is_file()
    again = wick(env, "rm", "--stale")
    assert again.returncode == 0 and "no stale artifacts" in again.stderr


def test_rm_stale_without_the_compiler_names_the_extra(monkeypatch):
    from wick.compiler import extra
    from wick.server.cli import CLIError, cmd_rm

    monkeypatch.setattr(extra, "missing_compiler_modules", lambda: ["apache-tvm"])
    with pytest.raises(CLIError, match=r"pip install 'wick-llm\[compile\]'"):
        cmd_rm(argparse.Namespace(name=None, stale=True))


def test_models_lists_builtins(wick_env):
    from wick.compiler.sources import builtin_models

    result = wick(wick_env, "models")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["NAME", "FAMILY", "PARAMS", "KIND", "DEFAULT", "DOWNLOAD",
                              "LICENSE", "SAMPLING"]
    listed = {row.split()[0]: row for row in rows}
    assert set(listed) == set(builtin_models())
    assert listed["qwen2.5-coder-0.5b-instruct"].split()[1:4] == ["qwen2", "494M", "chat"]
    assert listed["smollm2-135m-instruct"].split()[1] == "llama"
    # the model card's sampling where a GGUF has no generation_config.json; none for MiniLM
    assert listed["smollm2-135m-instruct"].endswith("temperature=0.2 top_p=0.9 (model card)")
    assert listed["all-minilm-l6-v2"].endswith(" -")


def test_serve_starts_answers_and_stops(wick_env, artifact):
    """`wick serve ARTIFACT`: /health goes 503 -> 200, /v1/models lists the model, the log names
    the model, quantization, adapter and URL (and says so when the adapter is a software one).
    Only the served artifact is hosted, not the rest of the cache. SIGTERM during a stream: the
    stream still ends with [DONE], the server exits cleanly, no traceback."""
    import json
    import signal
    import socket
    import threading
    import urllib.error
    import urllib.request

    from wick.compiler.paths import artifacts_dir

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    command = [str(WICK)] if WICK.exists() else [
        sys.executable, "-c", "import sys; from wick.server.cli import main; sys.exit(main())"]
    proc = subprocess.Popen([*command, "serve", str(artifact), "--port", str(port),
                             "--shutdown-grace", "0.5"],
                            env=wick_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace")
    streamed: list[str] = []
    try:
        status, deadline = None, time.monotonic() + 120
        while status != 200 and time.monotonic() < deadline and proc.poll() is None:
            try:
                status = urllib.request.urlopen(f"{base}/health", timeout=5).status
            except urllib.error.HTTPError as e:
                status = e.code
                assert status == 503  # loading
            except OSError:
                pass
            time.sleep(0.2)
        assert status == 200, proc.poll()
        models = json.load(urllib.request.urlopen(f"{base}/v1/models"))
        assert models["object"] == "list" and len(models["data"]) == 1
        index = json.load(urllib.request.urlopen(f"{base}/web/models.json"))
        assert [m["id"] for m in index["data"]] == [artifact.name]
        others = [d.name for d in artifacts_dir().iterdir() if (d / "wick-artifact.json").is_file()]
        assert others, "the cache should hold other artifacts"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/artifacts/{others[0]}/wick-artifact.json")
        assert e.value.code == 404

        def stream() -> None:
            body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                               "max_tokens": 400, "ignore_eos": True}).encode()
            req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                streamed.extend(line.decode().strip() for line in r if line.strip())

        reader = threading.Thread(target=stream)
        reader.start()
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    reader.join(30)
    assert proc.returncode == 0, out
    # (no GPU here: "auto" means the CPU kernels; wgpu on a machine with a real GPU)
    assert re.search(rf"wick serving {models['data'][0]['id']} \(q0f32, (cpu|wgpu): ", out), out
    assert f"on {base}" in out
    if "llvmpipe" in out or "lavapipe" in out:
        assert "is a software GPU" in out and "browser engine" in out
    assert "Traceback" not in out and "CancelledError" not in out
    assert streamed and streamed[-1] == "data: [DONE]", streamed[-3:]
    last = json.loads(streamed[-2].removeprefix("data: "))
    assert last.get("error", {}).get("code") == "server_shutdown" or \
        last["choices"][0]["finish_reason"] == "length"


# --------------------------------------------------------------------------- /set parsing


def test_set_parses_and_validates():
    assert parse_settings("temperature=0.5; top_p=0.9;max_tokens=100", {}) == {
        "temperature": 0.5, "top_p": 0.9, "max_tokens": 100}
    assert parse_settings("seed=none", {"seed": 3, "top_k": 2}) == {"top_k": 2}
    for bad, needle in [("bogus=1", "unknown setting"), ("temperature", "needs a value"),
                        ("top_k=abc", "must be an integer"), ("temperature=3", "temperature"),
                        ("max_tokens=0", "max_tokens"), ("", "usage")]:
        with pytest.raises(InvalidRequestError, match=needle):
            parse_settings(bad, {})


@pytest.mark.parametrize("flags,message", [
    (["--min-replicas", "2"], "needs both --min-replicas and --max-replicas"),
    (["--replicas", "2", "--max-replicas", "3"], "either --replicas N or"),
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--min-replicas", "3", "--max-replicas", "2"], "at least --min-replicas"),
    (["--ray-address", "head:6379"], "--ray-address needs --replicas"),
    (["--replicas", "2", "--ray-address", "ray://head:10001"], "Ray Client (ray://) cannot"),
    (["--ray-app", "other"], "--ray-app needs --replicas"),
    (["--replica-gpus", "1"], "--replica-gpus needs --replicas"),
    (["--replicas", "2", "--ray-app", "a b"], "--ray-app 'a b': use letters"),
    (["--replicas", "2", "--replica-gpus", "-1"], "--replica-gpus -1: give 0 or more"),
    (["--replicas", "2", "--replica-gpus", "1.5"], "a fraction of one GPU"),
    (["--replicas", "2", "--replica-gpus", "nan"], "--replica-gpus nan"),
    (["--replicas", "2", "--replica-gpus", "0.00001"], "a fraction of one GPU"),
])
def test_serve_refuses_bad_replica_flags_in_one_line(flags, message, capsys):
    from wick.server.cli import main

    assert main(["serve", "some-model", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_replica_gpus_default_to_one_each_on_cuda_and_the_app_name_is_passed_on():
    pytest.importorskip("ray")
    from wick.server.serve import add_replica_arguments, replicas_of

    def parsed(*flags: str):
        p = argparse.ArgumentParser()
        p.add_argument("--device", default="auto")
        add_replica_arguments(p)
        return replicas_of(p.parse_args(list(flags)))

    assert parsed("--replicas", "2").gpus == 0 and parsed("--replicas", "2").app == "wick"
    assert parsed("--replicas", "2", "--device", "cuda").gpus == 1
    r = parsed("--replicas", "2", "--device", "cuda", "--replica-gpus", "0.5", "--ray-app", "b")
    assert (r.gpus, r.app, r.registry) == (0.5, "b", "b-replica-registry")
    assert parsed("--min-replicas", "0", "--max-replicas", "3").least == 1
    # the bounds are Ray Serve's autoscaling config (validated by Ray's own model)
    from ray.serve.config import AutoscalingConfig

    assert parsed("--replicas", "2").deployment_options() == {"num_replicas": 2}
    options = parsed("--min-replicas", "0", "--max-replicas", "3").deployment_options()
    config = AutoscalingConfig(**options["autoscaling_config"])
    assert (config.min_replicas, config.max_replicas, config.initial_replicas) == (0, 3, 1)
    assert config.target_ongoing_requests == 4


@pytest.mark.parametrize("flags, message", [
    (["--kv-cache-mib", "0"], "argument --kv-cache-mib: must be >= 1, got 0"),
    (["--kv-cache-mib", "-5"], "argument --kv-cache-mib: must be >= 1, got -5"),
    (["--port", "99999"], "argument --port: must be in [0, 65535], got 99999"),
    (["--max-body-mib", "nan"], "argument --max-body-mib: must be a finite number"),
    (["--header-timeout", "0"], "argument --header-timeout: must be > 0, got 0"),
    (["--num-speculative-tokens", "65"], "must be in [1, 64], got 65"),
])
def test_serve_refuses_out_of_range_numbers_before_starting(flags, message, capsys):
    """A number no server can run with is argparse's usage error (exit 2) naming the range:
    ``--kv-cache-mib -5`` used to start a server with one KV page that refused every request,
    ``--port 99999`` to end in an OverflowError called a wick bug."""
    from wick.server.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "some-model", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_of_an_unknown_model_or_a_taken_port_is_one_error_line(wick_env, artifact):
    """Both before the server listens: a name that names nothing (no log lines of a server
    that started and failed to load it), and a port another program holds (what to do, not
    "a wick bug")."""
    import socket

    result = wick(wick_env, "serve", "no-such-model-xyz", "--port", "0", timeout=60)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert "'no-such-model-xyz' does not exist" in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        result = wick(wick_env, "serve", str(artifact), "--port", port, timeout=60)
    no_traceback(result)
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in line
    assert "--port" in line and "wick bug" not in line


def test_an_artifacts_directory_name_names_it_for_serve_chat_and_embed(tmp_path, monkeypatch):
    """``wick list`` shows each cached artifact's directory; its name alone names it (wick chat
    and embed took it, wick serve now too), and a name that is no artifact's stays as given."""
    from wick.engine.artifact import MANIFEST_NAME
    from wick.server.local import check_model_named, named_artifact

    monkeypatch.setenv("WICK_HOME", str(tmp_path))
    cached = tmp_path / "artifacts" / "tiny-q0f32-0123456789abcdef"
    cached.mkdir(parents=True)
    (cached / MANIFEST_NAME).write_text("{}")
    assert named_artifact(cached.name) == str(cached)
    check_model_named(named_artifact(cached.name))
    for other in ("smollm2-135m-instruct", "no-such-artifact", "./tiny", "a/b"):
        assert named_artifact(other) == other
