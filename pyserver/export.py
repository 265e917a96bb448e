"""``wick export DIR MODEL...``: a static site running the browser engine, for any static host.

The site is the part of ``wick serve``'s URL space a browser engine reads, written as files
under DIR, so every reference in it is relative and DIR works at any sub-path of any static
server (``python -m http.server`` included), with no wick server anywhere:

    DIR/index.html               the chat page (browser engine only)
    DIR/wick.js                  the ES module to import (re-exports static/wick.js)
    DIR/static/                  wick.js, wick-worker.js, the chat page's script and style,
                                 site.js (the page's settings), wasm/ (Pyodide, the engine's
                                 wheels, tokenizer and grammar wasm: content-hashed names)
    DIR/web/models.json          the model index (``GET /web/models.json``)
    DIR/artifacts/ID/...         each artifact's manifest, tokenizer, WGSL and WebAssembly
                                 kernels and weight shards (sha256 in the manifest)

wick.js finds the site's root from its own URL (the path before its ``/static/``), so a page
anywhere that imports ``https://host/any/path/wick.js`` loads from that export; pages with
COOP/COEP headers run the WebAssembly kernels on every core, others on one thread.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from ..engine.artifact import MANIFEST_NAME, WASM_KINDS, kernel_files
from ..engine.errors import InvalidRequestError, WickError
from .artifact_host import ArtifactHost, scrub_manifest
from .extension_build import STATIC, chat_page_with, check_built

MARKER = "wick-export.json"  # what says a directory is an export this command may replace
# the kernel sets a browser runs (the manifest's ``kernel_sets``)
BROWSER_KERNELS = ("webgpu", *WASM_KINDS)
# what `wick serve` sends with its pages, and a static host must send for threads
ISOLATION_HEADERS = ("Cross-Origin-Opener-Policy: same-origin",
                     "Cross-Origin-Embedder-Policy: require-corp")
SITE_JS = """\
// Written by `wick export`: the chat page's settings (static/chat.js reads them). The site's
// root is this script's directory's parent, wherever the site is hosted.
globalThis.wickChat = {
  host: new URL("..", document.currentScript.src).href.replace(/\\/$/, ""),
  wickModule: new URL("wick.js", document.currentScript.src).href,
  browserOnly: true,
};
"""

Progress = Callable[[str, int, int], None]


class ExportError(WickError):
    default_status = 500
    default_code = "export_failed"


def chat_page_html() -> str:
    """The chat page with relative references and the site's settings."""
    return chat_page_with({'href="/static/chat.css"': 'href="static/chat.css"',
                           '<script type="module" src="/static/chat.js"></script>':
                               '<script src="static/site.js"></script>\n'
                               '  <script type="module" src="static/chat.js"></script>'},
                          ExportError, "pyserver/export.chat_page_html")


def browser_files(manifest: dict) -> list[str]:
    """The files of an artifact the browser engine reads (relative paths), manifest first."""
    files = [MANIFEST_NAME, manifest["tokenizer"]["file"]]
    sets = manifest["kernel_sets"]
    if not any(kind in sets for kind in BROWSER_KERNELS):
        raise ExportError(f"{manifest['model_id']} ({manifest['quantization']}) was compiled "
                          f"with --kernel-sets {','.join(sets)}: a browser runs webgpu or wasm; "
                          "compile it with those (or without --kernel-sets)", status=400,
                          code="kernel_set_missing")
    files += [f["file"] for kind in BROWSER_KERNELS if kind in sets for f in kernel_files(sets[kind])]
    files += [s["file"] for s in manifest["shards"]]
    return files


def _place(src: Path, dst: Path) -> None:
    """``dst`` holds ``src``'s bytes: a hard link where the filesystem allows (weights are
    large and never change in place), else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    src = src.resolve()  # (a huggingface_hub snapshot links into its blobs)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def artifacts_for(models: list[str], quantization: str | None,
                  progress: Progress | None = None) -> tuple[list[Path], list[str]]:
    """The artifact directories to export for each model (compiled when needed): the asked
    variant; without one, the model's default and, where that needs shader-f16, its float32
    twin too (browsers without shader-f16, and the WebAssembly kernels, run that one). And
    notes for the user: twins that could not be had (a compiled artifact is exported as it is:
    its source may not be on this machine)."""
    from ..compiler.extra import CompilerMissingError
    from ..compiler.quantization import f32_twin
    from .local import load_artifact

    out: list[Path] = []
    notes: list[str] = []
    everything = frozenset({"shader-f16"})
    for model in models:
        art = load_artifact(model, quantization, everything, progress)
        dirs = [Path(art.location).resolve()]  # (its name is its id in the site)
        twin = f32_twin(art.quantization)
        if quantization is None and twin is not None:
            try:
                dirs.append(Path(load_artifact(model, twin, everything, progress).location)
                            .resolve())
            except (InvalidRequestError, CompilerMissingError) as e:
                notes.append(f"{model} is exported as {art.quantization} only, which browsers "
                             f"without shader-f16 cannot run ({e.message})")
        out += [d for d in dirs if d not in out]
    return out, notes


def export_site(out: Path, models: list[str], quantization: str | None = None,
                progress: Progress | None = None) -> dict:
    """Write the static site for ``models`` to ``out``; returns a summary."""
    check_built([STATIC / "index.html", STATIC / "chat.js"], ExportError, "export again")
    if not models:
        raise InvalidRequestError("name at least one model to export", param="model")
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise InvalidRequestError(f"{out} is a file: choose a new or empty directory",
                                  param="output")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise InvalidRequestError(f"{out} exists and is not a wick export: choose a new or "
                                  "empty directory", param="output")
    dirs, notes = artifacts_for(models, quantization, progress)
    names = [d.name for d in dirs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidRequestError(f"two of the artifacts to export are named {twice[0]} (their "
                                  "id in the site): copy one under another name", param="model")
    tmp = out.with_name(f".{out.name}.tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        static = tmp / "static"
        static.mkdir(parents=True)
        for name in ("wick.js", "wick-worker.js", "wick.js.map", "wick-worker.js.map"):
            if (STATIC / "web" / name).is_file():
                shutil.copy2(STATIC / "web" / name, static / name)
        for name in ("chat.js", "chat.css"):
            shutil.copy2(STATIC / name, static / name)
        (static / "site.js").write_text(SITE_JS)
        shutil.copytree(STATIC / "wasm", static / "wasm")
        (tmp / "index.html").write_text(chat_page_html())
        (tmp / "wick.js").write_text('export * from "./static/wick.js";\n')
        host = ArtifactHost(None)
        for n, d in enumerate(dirs):
            manifest = json.loads((d / MANIFEST_NAME).read_bytes())
            target = tmp / "artifacts" / d.name
            for rel in browser_files(manifest):
                if rel == MANIFEST_NAME:
                    target.mkdir(parents=True, exist_ok=True)
                    (target / rel).write_bytes(scrub_manifest((d / rel).read_bytes()))
                else:
                    _place(d / rel, target / rel)
            host.add(d)
            if progress:
                progress("export artifacts", n + 1, len(dirs))
        index = {"data": host.artifacts(), "preparing": [], "served": [], "loading": False}
        (tmp / "web").mkdir()
        (tmp / "web" / "models.json").write_text(json.dumps(index, indent=1) + "\n")
        files = [p for p in tmp.rglob("*") if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        (tmp / MARKER).write_text(json.dumps({"models": index["data"]}, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"path": str(out), "files": len(files) + 1, "bytes": total,
            "models": [(e["model"], e["quantization"]) for e in index["data"]], "notes": notes}


def cmd_export(args) -> int:
    from .progress_bars import ProgressBars

    bars = ProgressBars()
    try:
        info = export_site(args.output, args.model, args.quantization, progress=bars)
    finally:
        bars.close()
    models = ", ".join(f"{m} {q}" for m, q in info["models"])
    for note in info["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(f"{info['path']}: static site, {info['bytes'] / 1048576:.1f} MiB in {info['files']} "
          f"files; models: {models}.\n"
          f"Serve the directory from any static host, at any path (e.g. `python -m http.server "
          f"-d {info['path']}`) and open index.html, or import wick.js from it.\n"
          "Without these two response headers the WebAssembly kernels run on one thread; with "
          "them, on every core:\n"
          + "".join(f"  {h}\n" for h in ISOLATION_HEADERS)
          + "(GitHub Pages cannot send them; Netlify and Cloudflare Pages read a `_headers` "
            "file, Firebase its firebase.json `headers`, nginx `add_header`; Hugging Face "
            "static Spaces set them with `custom_headers` in the README's front matter.)")
    return 0


def add_export_parser(sub) -> None:
    from ..compiler.quantization import QUANTIZATIONS

    p = sub.add_parser("export", help="write a static site running the browser engine",
                       description="Write OUTPUT: a static site (the chat page, wick.js and "
                                   "everything they load, the models' artifacts) that runs "
                                   "from any static host, at any path, with no wick server.")
    p.add_argument("output", type=Path, metavar="OUTPUT", help="a new (or earlier export's) "
                                                               "directory")
    p.add_argument("model", nargs="+", help="built-in name, hf://ORG/REPO, Hugging Face dir, "
                                            ".gguf file or compiled artifact dir")
    p.add_argument("--quantization", "-q", choices=tuple(QUANTIZATIONS),
                   help="the variant to export (default: the model's own, plus its float32 twin "
                        "for browsers without shader-f16)")
    p.set_defaults(run=cmd_export)
