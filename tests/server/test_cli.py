"""The ``wick`` command line, run as a user runs it: a subprocess per command, on a tiny random
Llama compiled to q0f32 (lavapipe is enough). Plus the /set parser, without a subprocess."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from wick.engine.errors import InvalidRequestError
from wick.server.chat_cli import parse_settings

pytest.importorskip("wgpu")
pytest.importorskip("tvm")

WICK = Path(sys.executable).with_name("wick")
CHAT_OPTIONS = ("--seed", "0", "--max-tokens", "8")


@pytest.fixture(scope="module")
def wick_env(tmp_path_factory) -> dict[str, str]:
    env = dict(os.environ)
    env["WICK_HOME"] = os.environ["WICK_HOME"]  # the test session's cache (tests/conftest.py)
    env["PYTHONIOENCODING"] = "utf-8"
    # lavapipe's loader complains on stderr without one; keep stderr to wick's own lines
    env.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg")))
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
    assert "q0f32" in line and "KiB" in line


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
    assert re.fullmatch(r"wick chat: .+ \(q0f32\) on .+", lines[0])
    assert "/help" in lines[1]
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


def test_chat_bad_sampling_option_is_one_line(artifact, wick_env):
    result = wick(wick_env, "chat", str(artifact), "--temperature", "5")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: Invalid value for "
                                                             "'temperature'")
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


def test_models_lists_builtins(wick_env):
    result = wick(wick_env, "models")
    assert result.returncode == 0 and "smollm2-135m-instruct" in result.stdout


def test_serve_starts_answers_and_stops(wick_env, artifact):
    """`wick serve ARTIFACT`: /health goes 503 -> 200, /v1/models lists the model, the log names
    the model, quantization, adapter and URL."""
    import json
    import signal
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(WICK)] if WICK.exists() else [
        sys.executable, "-c", "import sys; from wick.server.cli import main; sys.exit(main())"]
    proc = subprocess.Popen([*command, "serve", str(artifact), "--port", str(port)],
                            env=wick_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace")
    try:
        status, deadline = None, time.monotonic() + 120
        while status != 200 and time.monotonic() < deadline and proc.poll() is None:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status
            except urllib.error.HTTPError as e:
                status = e.code
                assert status == 503  # loading
            except OSError:
                pass
            time.sleep(0.2)
        assert status == 200, proc.poll()
        models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))
        assert models["object"] == "list" and len(models["data"]) == 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert f"wick serving {models['data'][0]['id']} (q0f32, wgpu:" in out
    assert f"on http://127.0.0.1:{port}" in out
    assert "Traceback" not in out


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
