"""``wick extension build OUT --host URL``: wick as a Chrome extension (Manifest V3).

Everything the engine runs is packaged (MV3 allows no remote code): the browser engine's
bundles (wick.js, wick-worker.js), Pyodide with wick's wheels and the tokenizer/grammar
libraries (wasm/), the extension's own scripts and pages (web/src/extension, built and copied
into static/ext/) and the chat page's chat.js/chat.css for the side panel. Only model
files come from the network: from ``--host`` (a ``wick serve``), cached in the extension's
Cache API. One of them is compiled: a model's WebAssembly kernels (its own shapes, one module
per model variant, so a build cannot hold those of every model its host may serve later),
checked against the manifest's sha256 first; hence ``'wasm-unsafe-eval'`` in the CSP
(tests/browser/test_extension.py proves nothing else is fetched to run). OUT ending in ``.zip`` gives the Web Store upload; anything else an unpacked
directory (chrome://extensions, Developer mode, Load unpacked).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

from ..engine.errors import InvalidRequestError, WickError

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
SCRIPTS = ("background.js", "offscreen.js", "sidepanel.js", "options.js")
PAGES = ("offscreen.html", "options.html")  # (sidepanel.html is the chat page, side_panel_html)
CSP = "script-src 'self' 'wasm-unsafe-eval'; object-src 'self'"


class ExtensionBuildError(WickError):
    default_status = 500
    default_type = "build_error"
    default_code = "extension_build_failed"


def _origin(text: str, what: str, *, path_ok: bool) -> tuple[str, str]:
    """(origin, path) of an http(s) URL, or a 400 naming ``what``."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(f"{what} must be an http(s) URL such as http://127.0.0.1:8000, "
                                  f"not {text!r}", param=what.split()[0])
    if not path_ok and parts.path not in ("", "/"):
        raise InvalidRequestError(f"{what} is an origin (scheme, host, port), not {text!r}",
                                  param=what.split()[0])
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


def _pattern(origin: str) -> str:
    """A match pattern for ``origin``: Chrome's patterns name no port (they match any)."""
    parts = urlsplit(origin)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{parts.scheme}://{host}/*"


def manifest(host: str, allowed: list[str], version: str) -> dict:
    connectable = sorted({_pattern(o) for o in allowed})
    out = {
        "manifest_version": 3,
        "name": "wick",
        "version": version,
        "description": "A local LLM engine on your GPU (WebGPU): a side-panel chat, and the same "
                       "engine for the extension's pages and the sites you allow.",
        "minimum_chrome_version": "124",  # WebGPU in workers; chrome.runtime.getContexts
        "permissions": ["offscreen", "storage", "unlimitedStorage", "sidePanel"],
        "host_permissions": [_pattern(host)],
        "optional_host_permissions": ["http://*/*", "https://*/*"],  # another host (options)
        "background": {"service_worker": "background.js", "type": "module"},
        "side_panel": {"default_path": "sidepanel.html"},
        "options_page": "options.html",
        "action": {"default_title": "wick"},
        "content_security_policy": {"extension_pages": CSP},
    }
    if connectable:
        out["externally_connectable"] = {"matches": connectable}
    return out


def chat_page_with(swaps: dict[str, str], error: type[WickError], owner: str) -> str:
    """The chat page (static/index.html) with each of its references ``swaps`` names replaced:
    one page, several doors (the server, the extension's side panel, an export's index).
    ``owner`` is the function to update when the page no longer has one of them."""
    html = (STATIC / "index.html").read_text()
    for old, new in swaps.items():
        if old not in html:
            raise error(f"static/index.html no longer refers to {old}: update {owner}")
        html = html.replace(old, new)
    return html


def side_panel_html() -> str:
    """The chat page with the extension's script."""
    return chat_page_with({'href="/static/chat.css"': 'href="chat.css"',
                           'src="/static/chat.js"': 'src="sidepanel.js"'},
                          ExtensionBuildError, "extension_build.side_panel_html")


def _chrome_version(version: str) -> str:
    """Chrome wants 1-4 dot-separated integers: '0.1.0.dev3' -> '0.1.0'."""
    nums = []
    for piece in version.split("."):
        digits = re.match(r"\d*", piece).group()  # '3rc1' -> '3'
        if not digits:
            break
        nums.append(str(int(digits)))
        if digits != piece:
            break
    return ".".join(nums[:4]) or "0.1"


def check_built(extra: list[Path], error: type[WickError], then: str) -> None:
    """Raise ``error`` unless the browser engine is built (with the ``extra`` files under
    static/ too); ``then``: what to do once it is."""
    need = [STATIC / "web" / "wick.js", STATIC / "web" / "wick-worker.js",
            STATIC / "wasm" / "manifest.json", *extra]
    missing = [str(p.relative_to(STATIC)) for p in need if not p.is_file()]
    if missing:
        raise error(f"the browser engine is not built ({', '.join(missing)} missing): run "
                    f"`bash web/build.sh` (needs node and npm), then {then}")


def build_extension(out: Path, host: str, allow_origins: list[str] | tuple[str, ...] = ()) -> dict:
    """Write the extension to ``out`` (a directory, or a .zip file); returns a summary."""
    from .._version import __version__

    host_origin, host_path = _origin(host, "host URL", path_ok=True)
    allowed = sorted({_origin(o, "allow-origin", path_ok=False)[0] for o in allow_origins})
    check_built([STATIC / "ext" / s for s in SCRIPTS + PAGES], ExtensionBuildError,
                "build the extension again")
    man = manifest(host_origin, allowed, _chrome_version(__version__))
    config = {"host": host_origin + host_path, "allowedOrigins": allowed,
              "connectable": man.get("externally_connectable", {}).get("matches", [])}
    out = Path(out)
    zipped = out.suffix == ".zip"
    with tempfile.TemporaryDirectory(prefix="wick-extension-") as tmp:
        root = Path(tmp) / "ext" if zipped else out
        if root.exists():
            # only a directory this command wrote (its wick-extension.json) is replaced
            if not (root / "wick-extension.json").is_file() and any(root.iterdir()):
                raise InvalidRequestError(f"{root} exists and is not a wick extension: choose a new "
                                          "or empty directory", param="output")
            shutil.rmtree(root)
        root.mkdir(parents=True)
        for name in ("wick.js", "wick-worker.js"):
            shutil.copy2(STATIC / "web" / name, root / name)
        shutil.copytree(STATIC / "wasm", root / "wasm")
        for name in SCRIPTS + PAGES:
            shutil.copy2(STATIC / "ext" / name, root / name)
        (root / "sidepanel.html").write_text(side_panel_html())
        for name in ("chat.js", "chat.css"):
            shutil.copy2(STATIC / name, root / name)
        (root / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
        (root / "wick-extension.json").write_text(json.dumps(config, indent=2) + "\n")
        files = sorted(p for p in root.rglob("*") if p.is_file())
        nbytes = sum(p.stat().st_size for p in files)
        if zipped:
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_suffix(".zip.partial")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
                for p in files:
                    z.write(p, p.relative_to(root).as_posix())
            partial.replace(out)
    return {"path": str(out), "files": len(files), "bytes": nbytes, "host": config["host"],
            "allowed_origins": allowed, "zip": zipped}


def cmd_extension_build(args) -> int:
    info = build_extension(args.output, args.host, args.allow_origin or [])
    size = f"{info['bytes'] / 1048576:.1f} MiB in {info['files']} files"
    where = ("upload it to the Chrome Web Store" if info["zip"] else
             "load it at chrome://extensions (Developer mode, Load unpacked)")
    print(f"{info['path']}: wick extension, {size}; models from {info['host']}"
          + (f"; sites allowed: {', '.join(info['allowed_origins'])}" if info["allowed_origins"] else "")
          + f". Next: {where}.")
    return 0


def add_extension_parser(sub) -> None:
    p = sub.add_parser("extension", help="build wick as a Chrome extension",
                       description="wick as a Chrome extension (MV3): a side-panel chat and one "
                                   "engine for the extension's pages and the sites you allow.")
    esub = p.add_subparsers(dest="extension_command", metavar="ACTION", required=True)
    b = esub.add_parser("build", help="write the extension (a directory, or a .zip)",
                        description="Write the extension to OUTPUT: a directory to load unpacked, "
                                    "or OUTPUT.zip for the Chrome Web Store.")
    b.add_argument("output", type=Path, metavar="OUTPUT", help="directory, or a path ending in .zip")
    b.add_argument("--host", required=True,
                   help="the wick host the models come from (`wick serve`'s URL), e.g. "
                        "http://127.0.0.1:8000; the options page can change it")
    b.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                   help="a web origin that may use the engine (createExtensionEngine); repeat for "
                        "more. The options page can revoke it.")
    b.set_defaults(run=cmd_extension_build)
