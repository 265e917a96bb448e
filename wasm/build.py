"""Build the browser engine's static assets into ``pyserver/static/wasm/`` (stdlib only).

    python wasm/build.py [--out DIR] [--node-modules web/node_modules]

Writes, each under a content-hashed name (immutable, cacheable forever):

- ``wheels/<hash>/wick-<version>-py3-none-any.whl``: ``wick/__init__.py``, ``wick/_version.py``
  and ``wick/engine/*.py``
  (the engine, stdlib only) -- nothing else of wick;
- ``wheels/<hash>/wick_web-<version>-py3-none-any.whl``: the Pyodide-side glue (``wasm/wick_web``);
- ``wheels/<hash>/jinja2-*.whl``: from ``pip download jinja2 --no-deps`` (pure);
- ``wheels/<hash>/markupsafe-*.whl``: MarkupSafe's sdist repackaged without the C speedups
  (it falls back to pure Python);
- ``pyodide-<hash>/``: Pyodide's runtime from the npm package (no CDN);
- ``web-tokenizers-<hash>.js``: ``@mlc-ai/web-tokenizers`` (HF tokenizers in wasm, embedded);
- ``web-xgrammar-<hash>.js``: ``@mlc-ai/web-xgrammar`` (xgrammar in wasm, embedded; imported by
  the worker on the first request with a grammar);

and ``manifest.json`` (not hashed, served no-cache) naming them. The worker reads the manifest.

Each wheel also carries its modules' bytecode for Pyodide's interpreter (``__pycache__/*.pyc``,
compiled by that interpreter under Node: wasm/bytecode.mjs): Pyodide does not write bytecode,
so without it every first start compiled the engine, jinja2 and the glue from source. Without
``node`` the wheels hold sources only (they work, the first start is slower).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JINJA2 = "jinja2==3.1.6"
MARKUPSAFE = "markupsafe==3.0.3"
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip",
                 "pyodide-lock.json")
# zip entries get a fixed timestamp so that the same sources give the same wheel (and hash)
EPOCH = (2020, 1, 1, 0, 0, 0)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record_line(name: str, data: bytes) -> str:
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={h},{len(data)}"


def make_wheel(dist: str, version: str, files: dict[str, bytes]) -> tuple[str, bytes]:
    """A pure-Python wheel (py3-none-any) holding ``files`` (archive path -> bytes)."""
    info = f"{dist}-{version}.dist-info"
    files = dict(sorted(files.items()))
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: wick wasm/build.py\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, EPOCH)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data)
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue()


def wick_version() -> str:
    """wick's version, from the one file that says it."""
    scope: dict = {}
    exec((ROOT / "wick" / "_version.py").read_text(), scope)
    return scope["__version__"]


def engine_wheel() -> tuple[str, bytes]:
    files = {f"wick/{name}": (ROOT / "wick" / name).read_bytes()
             for name in ("__init__.py", "_version.py")}
    for p in sorted((ROOT / "engine").glob("*.py")):
        files[f"wick/engine/{p.name}"] = p.read_bytes()
    return make_wheel("wick", wick_version(), files)


def glue_wheel() -> tuple[str, bytes]:
    files = {f"wick_web/{p.name}": p.read_bytes()
             for p in sorted((ROOT / "wasm" / "wick_web").glob("*.py"))}
    return make_wheel("wick_web", wick_version(), files)


def _pip_download(spec: str, dest: Path, *extra: str) -> Path:
    # Inside pip's isolated wheel build (setup.py runs this), PYTHONPATH/PYTHONNOUSERSITE hide
    # the interpreter's own site-packages and with them pip: drop them for this one call.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    # pip's own warnings (index settings of this machine) are noise here: shown on failure only
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                           str(dest), *extra, spec], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"wasm: pip download {spec} failed (exit {done.returncode})")
    name = spec.split("==")[0].lower()
    (found,) = [p for p in dest.iterdir() if p.name.lower().startswith(name)]
    return found


def vendored_wheels(cache: Path) -> list[tuple[str, bytes]]:
    cache.mkdir(parents=True, exist_ok=True)
    jinja = next(cache.glob("jinja2-*.whl"), None) or _pip_download(JINJA2, cache, "--only-binary", ":all:")
    sdist = next(cache.glob("markupsafe-*.tar.gz"), None) or _pip_download(
        MARKUPSAFE, cache, "--no-binary", ":all:")
    version = MARKUPSAFE.split("==")[1]
    files = {}
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if m.isfile() and "src" in parts and parts[-2] == "markupsafe":
                if parts[-1].endswith((".py", ".typed")):  # no _speedups.c: pure fallback
                    files[f"markupsafe/{parts[-1]}"] = tar.extractfile(m).read()
    if "markupsafe/__init__.py" not in files:
        raise SystemExit(f"{sdist}: no src/markupsafe/__init__.py")
    return [(jinja.name, jinja.read_bytes()), make_wheel("markupsafe", version, files)]


def with_files(wheel: bytes, extra: dict[str, bytes]) -> bytes:
    """``wheel`` with ``extra`` (archive path -> bytes) added and its RECORD written again."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as z:
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        entries = [(i, z.read(i)) for i in z.infolist() if i.filename != record]
    for name, data in sorted(extra.items()):
        zi = zipfile.ZipInfo(name, EPOCH)
        zi.external_attr = 0o644 << 16
        entries.append((zi, data))
    lines = [_record_line(i.filename, d) for i, d in entries] + [f"{record},,"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in entries:
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        rec = zipfile.ZipInfo(record, EPOCH)
        rec.external_attr = 0o644 << 16
        rec.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(rec, ("\n".join(lines) + "\n").encode())
    return buf.getvalue()


def with_bytecode(wheels: list[tuple[str, bytes]], pyodide: Path) -> list[tuple[str, bytes]]:
    """The wheels with Pyodide's bytecode of their modules beside the sources (see above)."""
    node = shutil.which("node")
    if node is None:
        print("wasm: no node here: the wheels carry no bytecode (a first start compiles them)",
              file=sys.stderr)
        return wheels
    with tempfile.TemporaryDirectory() as tmp:
        roots = [Path(tmp, str(i)) for i in range(len(wheels))]
        for root, (_, data) in zip(roots, wheels):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for name in z.namelist():
                    if name.endswith(".py"):
                        (root / name).parent.mkdir(parents=True, exist_ok=True)
                        (root / name).write_bytes(z.read(name))
        done = subprocess.run([node, str(ROOT / "wasm" / "bytecode.mjs"), str(pyodide), tmp],
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            raise SystemExit(f"wasm: compiling the wheels' bytecode failed (exit {done.returncode})")
        return [(name, with_files(data, {p.relative_to(root).as_posix(): p.read_bytes()
                                          for p in root.rglob("*.pyc")}))
                for root, (name, data) in zip(roots, wheels)]


def build(out: Path, node_modules: Path) -> dict:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    manifest: dict = {"wheels": []}
    wheels = with_bytecode([engine_wheel(), glue_wheel(),
                            *vendored_wheels(ROOT / "build" / "wasm-cache")],
                           node_modules / "pyodide")
    for name, data in wheels:
        rel = f"wheels/{_digest(data)[:16]}/{name}"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
        manifest["wheels"].append({"file": rel, "sha256": _digest(data)})

    pyo = node_modules / "pyodide"
    h = hashlib.sha256()
    for f in PYODIDE_FILES:
        h.update(f.encode() + b"\0" + (pyo / f).read_bytes())
    pdir = f"pyodide-{h.hexdigest()[:16]}"
    (out / pdir).mkdir()
    for f in PYODIDE_FILES:
        shutil.copyfile(pyo / f, out / pdir / f)
    manifest["pyodide"] = pdir + "/"
    manifest["pyodide_version"] = json.loads((pyo / "package.json").read_text())["version"]

    tok = (node_modules / "@mlc-ai" / "web-tokenizers" / "lib" / "index.js").read_bytes()
    tname = f"web-tokenizers-{_digest(tok)[:16]}.js"
    (out / tname).write_bytes(tok)
    manifest["tokenizers"] = tname
    xgr = (node_modules / "@mlc-ai" / "web-xgrammar" / "lib" / "index.js").read_bytes()
    xname = f"web-xgrammar-{_digest(xgr)[:16]}.js"
    (out / xname).write_bytes(xgr)
    manifest["xgrammar"] = xname
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "pyserver" / "static" / "wasm")
    ap.add_argument("--node-modules", type=Path, default=ROOT / "web" / "node_modules")
    args = ap.parse_args()
    m = build(args.out, args.node_modules)
    print(f"wasm: {len(m['wheels'])} wheels, {m['pyodide']}, {m['tokenizers']} -> {args.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
