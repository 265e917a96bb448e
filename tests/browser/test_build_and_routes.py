"""Pieces of the browser engine that need no browser: the wasm wheels, the glue's dispatch
encoding, the model index and the bundle routes."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]


def _build_module():
    spec = importlib.util.spec_from_file_location("wick_wasm_build", ROOT / "wasm" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_engine_wheel_holds_only_the_engine():
    name, data = _build_module().engine_wheel()
    assert name == "wick-0.1.0-py3-none-any.whl"
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    code = [n for n in names if not n.startswith("wick-0.1.0.dist-info/")]
    assert "wick/__init__.py" in code and "wick/engine/api.py" in code
    assert all(n in ("wick/__init__.py", "wick/_version.py") or n.startswith("wick/engine/")
               for n in code), code
    assert _build_module().engine_wheel() == (name, data)  # reproducible: same bytes, same hash


# (run by Node on Pyodide: every wheel unpacked, then each module's source made to fail, so an
# import can only succeed from the wheel's bytecode)
IMPORT_FROM_BYTECODE = """
import fs from "node:fs";
const [wasm] = process.argv.slice(2);
const man = JSON.parse(fs.readFileSync(wasm + "manifest.json"));
const { loadPyodide } = await import(wasm + man.pyodide + "pyodide.mjs");
const py = await loadPyodide({ indexURL: wasm + man.pyodide });
for (const w of man.wheels) py.unpackArchive(new Uint8Array(fs.readFileSync(wasm + w.file)), "wheel");
console.log(py.runPython(`
import pathlib, sys, wick
site = pathlib.Path(wick.__file__).parent.parent
del sys.modules["wick"]
for name in ("wick/__init__.py", "wick/engine/__init__.py", "wick/engine/api.py",
             "wick_web/host.py", "jinja2/__init__.py", "markupsafe/__init__.py"):
    (site / name).write_text("raise ImportError('compiled from source')")
import wick.engine.api, wick_web.host, jinja2, markupsafe
sys.implementation.cache_tag
`));
"""


def test_the_wheels_carry_pyodides_bytecode(web_bundle, tmp_path):
    """Every module of the four wheels has Pyodide's bytecode beside it (Pyodide writes none:
    a first start compiled each from source), and Pyodide imports it without its source."""
    import subprocess

    wasm = web_bundle / "wasm"
    for w in json.loads((wasm / "manifest.json").read_text())["wheels"]:
        names = set(zipfile.ZipFile(wasm / w["file"]).namelist())
        sources = {n for n in names if n.endswith(".py")}
        assert sources, w["file"]
        for src in sources:
            folder, _, stem = src.rpartition("/")
            assert any(n.startswith(f"{folder}/__pycache__/{stem[:-3]}.cpython-3")
                       and n.endswith(".pyc") for n in names), src
    script = tmp_path / "import.mjs"
    script.write_text(IMPORT_FROM_BYTECODE)
    done = subprocess.run(["node", str(script), f"{wasm}/"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT / "web")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("cpython-3")


def test_glue_encodes_a_step_as_flat_words():
    sys.path.insert(0, str(ROOT / "wasm"))
    try:
        from wick_web.backend import encode_dispatches
    finally:
        sys.path.remove(str(ROOT / "wasm"))
    from wick.engine.backend import BufferSlice, Dispatch

    d1 = Dispatch(3, (BufferSlice(1, 0, 16), BufferSlice(2, 256, 8)), b"\x01\x00\x00\x00" * 2, (70000, 2, 1))
    d2 = Dispatch(4, (BufferSlice(5, 0, 4),), b"", (1, 1, 1))
    cache: dict = {}
    words, uniforms = encode_dispatches([d1, d2], cache)
    assert list(words) == [3, 2, 1, 0, 16, 2, 256, 8, 8, 70000, 2, 1, 4, 1, 5, 0, 4, 0, 1, 1, 1]
    assert bytes(uniforms) == d1.uniform
    assert encode_dispatches([d1, d2], cache)[0] == words  # cached per dispatch


def test_glue_encodes_library_calls_with_dlpack_dtypes():
    """A wasm step's calls: function, nargs, then per tensor buffer, offset, the DLPack dtype
    word the kernels check (code | bits << 8 | lanes << 16, as numpy's DLPack export says),
    ndim and dims."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "wasm"))
    try:
        from wick_web.backend import encode_calls
    finally:
        sys.path.remove(str(ROOT / "wasm"))
    from wick.engine.backend import Call, TensorRef

    a = TensorRef(7, 128, (2, 3), "float16")
    b = TensorRef(9, 0, (5,), "int32")
    words = encode_calls([Call(4, (a, b)), Call(0, ())], {})
    assert list(words) == [4, 2, 7, 128, 2 | 16 << 8 | 1 << 16, 2, 2, 3,
                           9, 0, 0 | 32 << 8 | 1 << 16, 1, 5, 0, 0]
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    for dtype in ("float32", "float16", "int32", "uint32", "int64", "uint8", "int8", "bool"):
        word = encode_calls([Call(0, (TensorRef(1, 0, (1,), dtype),))], {})[4]
        capsule = np.zeros(1, dtype=dtype).__dlpack__()
        # DLTensor on a 64-bit host: data, device (8 bytes), ndim, then dtype at byte 20
        assert word == ctypes.c_uint32.from_address(get(capsule, b"dltensor") + 20).value, dtype


def test_model_index_and_bundle_routes(tmp_path):
    from wick.server.app import ModelPool, create_app
    from wick.server.artifact_host import ArtifactHost

    for name, model, quant, feats, mtime in (("m-old", "m", "q0f32", [], 1000),
                                              ("m-new", "m", "q0f32", [], 2000),
                                              ("m-f16", "m", "q4f16_1", ["shader-f16"], 1500)):
        d = tmp_path / name
        d.mkdir()
        (d / "wick-artifact.json").write_text(json.dumps(
            {"model_id": model, "quantization": quant,
             "requires": {"features": feats, "fallback": ["q4f32_1"] if feats else []},
             "kernel_sets": {"webgpu": {}, "wasm": {}} if feats else {}}))
        os.utime(d / "wick-artifact.json", (mtime, mtime))
    (tmp_path / "not-an-artifact").mkdir()
    client = TestClient(create_app(ModelPool(state="ready"), artifacts=ArtifactHost(tmp_path)),
                        base_url="http://localhost")
    r = client.get("/web/models.json")
    assert r.status_code == 200
    assert [a["id"] for a in r.json()["data"]] == ["m-new", "m-f16", "m-old"]  # newest first
    assert r.json()["data"][1] == {"id": "m-f16", "model": "m", "quantization": "q4f16_1",
                                   "features": ["shader-f16"], "fallback": ["q4f32_1"],
                                   "task": "generate", "kernel_sets": ["wasm", "webgpu"]}
    built = (ROOT / "pyserver" / "static" / "web" / "wick.js").is_file()
    r = client.get("/static/wick.js")
    assert r.status_code == (200 if built else 404)
    if built:
        assert r.headers["content-type"].startswith("text/javascript")
        assert "createEngine" in r.text
    assert client.get("/static/wick.js?name=../../app.py").text == r.text  # no parameters


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    """The working tree's files as a clone has them (tracked, and new ones git does not ignore):
    a wheel is built there, not in this tree, whose browser assets the other tests (and the
    other worker) are serving while setup.py rebuilds them."""
    import subprocess

    from tests.conftest import tool_missing

    if shutil.which("npm") is None or not (ROOT / ".git").exists():
        tool_missing("building the wheel from a clean tree needs npm (web/build.sh) and a git "
                     "checkout")
    tree = tmp_path_factory.mktemp("source") / "wick"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():  # (a tracked file deleted in the tree is not in a clone)
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    return tree


@pytest.fixture(scope="module")
def wheel(source_tree, tmp_path_factory) -> Path:
    """`pip wheel .` in a clean source tree: the distribution as users install it (setup.py
    builds the browser engine into it)."""
    import subprocess

    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    str(source_tree)], check=True)
    (wheel,) = out.glob("wick_llm-*.whl")  # (the distribution wick-llm)
    return wheel


def test_wheel_ships_the_browser_engine_and_serves_it(wheel, source_tree, tmp_path):
    """`pip wheel .` carries the built web/ and wasm/ assets (setup.py builds them when absent);
    installed from that wheel alone, the server serves every file the worker will ask for."""
    import subprocess

    names = zipfile.ZipFile(wheel).namelist()
    assert "wick/server/static/web/wick.d.ts" in names  # the public API's types
    assert "wick/server/static/web/types/client.d.ts" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel: unpacking is installing
    check = r"""
import hashlib, json, sys
import wick.server.app as app
from fastapi.testclient import TestClient
from wick.server.app import ModelPool, create_app
assert app.__file__.startswith(sys.argv[1]), app.__file__
c = TestClient(create_app(ModelPool(state="ready")), base_url="http://localhost")
for path in ("/static/wick.js", "/static/wick-worker.js", "/static/web/wick.js", "/"):
    r = c.get(path)
    assert r.status_code == 200 and r.content, path
assert b"createEngine" in c.get("/static/wick.js").content
man = c.get("/static/wasm/manifest.json").json()
for w in man["wheels"]:
    r = c.get("/static/wasm/" + w["file"])
    assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == w["sha256"], w
for f in ("pyodide.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"):
    assert c.get("/static/wasm/" + man["pyodide"] + f).status_code == 200, f
assert c.get("/static/wasm/" + man["tokenizers"]).status_code == 200
print("served", len(man["wheels"]), "wheels", [w["file"] for w in man["wheels"]])
# the installed package alone builds the Chrome extension
import pathlib
from wick.server.extension_build import build_extension
info = build_extension(pathlib.Path("ext"), "http://127.0.0.1:8000")
assert pathlib.Path("ext/background.js").is_file() and pathlib.Path("ext/sidepanel.html").is_file()
print("extension", info["files"], "files")
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", check, str(site)], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    wheels = json.loads((source_tree / "pyserver" / "static" / "wasm" / "manifest.json")
                        .read_text())["wheels"]
    assert f"served {len(wheels)} wheels" in r.stdout
    assert "extension " in r.stdout
    assert {"wick", "wick_web", "jinja2", "markupsafe"} <= {
        w["file"].rsplit("/", 1)[-1].split("-")[0].lower() for w in wheels}


def test_the_wheel_without_the_compile_extra_serves_an_artifact(wheel, tiny_q4_artifact,
                                                                  tiny_llama_dir, tmp_path):
    """The runtime-only install: the wheel's base requirements hold no compiler (TVM, zig: the
    `compile` extra does). Installed from the wheel alone, with tvm, tvm_ffi and ziglang
    unimportable, `wick serve ARTIFACT --device cpu` runs the artifact's CPU kernels on the
    runtime linked into them and answers what this process's engine answers; `wick compile`
    prints one error line naming the extra, exit 1."""
    import re
    import signal
    import socket
    import subprocess
    import time
    import urllib.error
    import urllib.request
    from email.parser import Parser

    from tests.conftest import wick_process_env
    from wick.compiler.extra import COMPILE_DISTRIBUTIONS
    from wick.server.local import Engine

    compile_extra = set(COMPILE_DISTRIBUTIONS.values())

    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist")
    name = lambda r: re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()  # noqa: E731
    base = {name(r) for r in requires if "extra ==" not in r}
    assert {"wgpu", "numpy", "tokenizers", "fastapi", "huggingface_hub"} <= base
    assert not base & compile_extra
    assert {name(r) for r in requires if re.search(r"extra == ['\"]compile['\"]", r)} == compile_extra

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = wick_process_env(WICK_TEST_WITHOUT=",".join(COMPILE_DISTRIBUTIONS))
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    command = [sys.executable, "-c", "import sys, wick; assert wick.__file__.startswith(sys.argv[1])"
               "; del sys.argv[1]; from wick.server.cli import main; sys.exit(main())", str(site)]

    done = subprocess.run([*command, "compile", str(tiny_llama_dir)], env=env, text=True,
                          capture_output=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: compiling "), lines
    assert "pip install 'wick-llm[compile]'" in lines[0] and "Traceback" not in lines[0]

    request = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
               "ignore_eos": True}
    expected = Engine(str(tiny_q4_artifact), device="cpu").completions.create(**request)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*command, "serve", str(tiny_q4_artifact), "--device", "cpu",
                             "--port", str(port), "--shutdown-grace", "0.5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path)
    try:
        base_url, status, deadline = f"http://127.0.0.1:{port}", None, time.monotonic() + 120
        while status != 200 and time.monotonic() < deadline and proc.poll() is None:
            try:
                status = urllib.request.urlopen(f"{base_url}/health", timeout=5).status
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                pass
            time.sleep(0.2)
        assert status == 200, proc.poll()
        body = json.dumps(request).encode()
        reply = json.load(urllib.request.urlopen(urllib.request.Request(
            f"{base_url}/v1/completions", data=body,
            headers={"Content-Type": "application/json"}), timeout=60))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert reply["choices"][0]["text"] == expected.choices[0].text, out
    assert reply["usage"]["completion_tokens"] == 12
    assert "cpu:" in out and "Traceback" not in out, out


TSC = ROOT / "web" / "node_modules" / ".bin" / "tsc"
TSC_OPTIONS = ["--noEmit", "--strict", "--target", "ES2022", "--module", "ES2022",
               "--moduleResolution", "bundler", "--lib", "ES2022,DOM,DOM.Iterable,WebWorker",
               "--types", "@webgpu/types,chrome", "--skipLibCheck"]


def test_the_js_types_are_the_engine_protocols():
    """web/src/protocol.gen.ts is what web/protocol_types.py writes from the engine's protocol
    now (run it after changing engine/protocol.py or pyserver/request_schemas.py)."""
    spec = importlib.util.spec_from_file_location("protocol_types", ROOT / "web" / "protocol_types.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "web" / "src" / "protocol.gen.ts").read_text() == mod.generate()


def test_an_app_using_tools_logprobs_and_streams_type_checks():
    """tests/browser/typecheck/usage.ts (tools, tool_calls, json_schema response format,
    logprobs, streams, legacy completions) compiles against the JS API under --strict;
    wrong.ts (a misspelt tool field, an unknown role, a json_schema without its name) fails
    on exactly those three calls."""
    import subprocess

    if not TSC.exists():
        from tests.conftest import tool_missing

        tool_missing("web/node_modules is missing (bash web/build.sh)")
    here = ROOT / "tests" / "browser" / "typecheck"
    ok = subprocess.run([str(TSC), *TSC_OPTIONS, str(here / "usage.ts")], cwd=ROOT / "web",
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout
    bad = subprocess.run([str(TSC), *TSC_OPTIONS, str(here / "wrong.ts")], cwd=ROOT / "web",
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in bad.stdout.splitlines() if ": error TS" in line]
    assert [e.split("(")[1].split(",")[0] for e in errors] == ["8", "9", "10"], bad.stdout


ESBUILD = ROOT / "web" / "node_modules" / ".bin" / "esbuild"
# (run by Node on web/src/model_names.ts bundled: which of the names the entries answer to)
ANSWERS = """
import { answersTo, modelNames } from "./model_names.mjs";
const { names, entries } = JSON.parse(process.argv[2]);
console.log(JSON.stringify({
  names: entries.map((e) => modelNames(e.model, e.quantization)),
  answers: entries.map((e) => names.filter((n) => answersTo(n, e))),
}));
"""


def run_ts(tmp_path: Path, module: str, script: str, *args: str) -> str:
    """Node's stdout running ``script`` beside web/src/``module``.ts bundled as ./``module``.mjs
    (how a TS copy of an engine rule is run on the engine's own inputs)."""
    import subprocess

    if not ESBUILD.exists():
        pytest.skip("web/node_modules is not installed (bash web/build.sh)")
    subprocess.run([str(ESBUILD), str(ROOT / "web" / "src" / f"{module}.ts"), "--format=esm",
                    f"--outfile={tmp_path / f'{module}.mjs'}", "--log-level=warning"],
                   check=True)
    (tmp_path / "run.mjs").write_text(script)
    return subprocess.run(["node", str(tmp_path / "run.mjs"), *args], capture_output=True,
                          text=True, check=True).stdout


def test_the_browser_names_models_as_the_engine_does(tmp_path):
    """web/src/model_names.ts against engine/model_info.py's model_names: the same names for the
    same models, in the browser's model index (pickModel) and the engine (check_model)."""
    from wick.engine.model_info import model_names

    entries = [{"model": "smollm2-135m-instruct", "quantization": "q4f32_1"},
               {"model": "Qwen/Qwen2.5-0.5B", "quantization": "q4f16_m", "id": "qwen-q4f16_m-1a2b"},
               {"model": "tiny", "quantization": "q0f32"}]
    names = ["smollm2-135m-instruct", "smollm2-135m-instruct-q4f32_1", "smollm2-135m-instruct-q0f32",
             "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-q4f16_m", "qwen-q4f16_m-1a2b", "tiny-q0f32",
             "tiny", "tiny-q4f32_1", "q0f32"]
    got = json.loads(run_ts(tmp_path, "model_names", ANSWERS,
                            json.dumps({"names": names, "entries": entries})))
    assert got["names"] == [list(model_names(e["model"], e["quantization"])) for e in entries]
    assert got["answers"] == [[n for n in names if n in model_names(e["model"], e["quantization"])
                               or n == e.get("id")] for e in entries]
    assert got["answers"][0] == ["smollm2-135m-instruct", "smollm2-135m-instruct-q4f32_1"]


KERNEL_FILES = """
import { readFileSync } from "node:fs";
import { kernelSetFiles } from "./kernel_sets.mjs";
const manifest = JSON.parse(readFileSync(process.argv[2], "utf8"));
console.log(JSON.stringify(Object.fromEntries(Object.entries(manifest.kernel_sets).map(
  ([kind, set]) => [kind, kernelSetFiles(set).map((f) => [f.file, f.sha256])]))));
"""


def test_the_browser_lists_a_kernel_sets_files_as_the_engine_does(tmp_path, tiny_artifact):
    """web/src/kernel_sets.ts against engine/artifact.py's kernel_files, on every kernel set of
    a compiled artifact: the files the worker fetches for its backend are the engine's."""
    from wick.engine.artifact import MANIFEST_NAME, kernel_files

    out = run_ts(tmp_path, "kernel_sets", KERNEL_FILES, str(tiny_artifact / MANIFEST_NAME))
    sets = json.loads((tiny_artifact / MANIFEST_NAME).read_text())["kernel_sets"]
    want = {kind: [[f["file"], f["sha256"]] for f in kernel_files(s)] for kind, s in sets.items()}
    assert json.loads(out) == want
    assert len(want["webgpu"]) > 1 and want["wasm"] == [[sets["wasm"]["file"], sets["wasm"]["sha256"]]]

