"""`wick extension build`: the MV3 manifest it writes, the packaged runtime (no remote code),
the .zip form, and its errors. No browser here: test_extension.py loads the result in Chromium."""

from __future__ import annotations

import json
import re
import zipfile

import pytest

from wick.engine.errors import InvalidRequestError


@pytest.fixture(scope="module")
def built(web_bundle, tmp_path_factory):
    from wick.server.extension_build import build_extension

    out = tmp_path_factory.mktemp("ext") / "wick-extension"
    info = build_extension(out, "http://127.0.0.1:8000/", ["https://app.example", "http://localhost:3000"])
    return out, info


def test_manifest_is_mv3_with_the_engine_pieces(built):
    out, info = built
    man = json.loads((out / "manifest.json").read_text())
    assert man["manifest_version"] == 3 and re.fullmatch(r"\d+(\.\d+){0,3}", man["version"])
    assert man["background"] == {"service_worker": "background.js", "type": "module"}
    assert {"offscreen", "storage", "sidePanel"} <= set(man["permissions"])
    assert man["host_permissions"] == ["http://127.0.0.1/*"]
    # Chrome's match patterns name no port: localhost:3000 becomes http://localhost/*
    assert man["externally_connectable"]["matches"] == ["http://localhost/*", "https://app.example/*"]
    assert "'wasm-unsafe-eval'" in man["content_security_policy"]["extension_pages"]
    for page in (man["side_panel"]["default_path"], man["options_page"], "offscreen.html"):
        html = (out / page).read_text()
        for src in re.findall(r'(?:src|href)="([^":]+)"', html):  # (not data: URLs)
            assert (out / src).is_file(), f"{page} refers to {src}, which is not packaged"
    assert 'src="sidepanel.js"' in (out / "sidepanel.html").read_text()  # the chat page's twin
    config = json.loads((out / "wick-extension.json").read_text())
    assert config == {"host": "http://127.0.0.1:8000", "connectable": man["externally_connectable"]["matches"],
                      "allowedOrigins": ["http://localhost:3000", "https://app.example"]}
    assert info["files"] == sum(1 for p in out.rglob("*") if p.is_file())


def test_the_runtime_is_packaged_not_fetched(built):
    out, _ = built
    wasm = json.loads((out / "wasm" / "manifest.json").read_text())
    assert (out / "wasm" / wasm["pyodide"] / "pyodide.mjs").is_file()
    for wheel in wasm["wheels"]:
        assert (out / "wasm" / wheel["file"]).is_file()
    for script in out.glob("*.js"):
        text = script.read_text()
        assert not re.search(r"(import|importScripts)\s*\(?\s*[\"']https?://", text), script.name


def test_zip_holds_the_same_files(built, tmp_path):
    from wick.server.extension_build import build_extension

    out, _ = built
    build_extension(tmp_path / "wick.zip", "https://models.example")
    names = set(zipfile.ZipFile(tmp_path / "wick.zip").namelist())
    assert names == {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    man = json.loads(zipfile.ZipFile(tmp_path / "wick.zip").read("manifest.json"))
    assert man["host_permissions"] == ["https://models.example/*"]
    assert "externally_connectable" not in man  # no site may ask


def test_bad_input_is_a_clear_error(web_bundle, tmp_path, capsys):
    from wick.server.cli import main
    from wick.server.extension_build import build_extension

    with pytest.raises(InvalidRequestError, match="must be an http") as e:
        build_extension(tmp_path / "x", "ftp://models.example")
    assert e.value.param == "host"
    with pytest.raises(InvalidRequestError, match="is an origin") as e:
        build_extension(tmp_path / "x", "http://h", ["https://app.example/some/page"])
    assert e.value.param == "allow-origin"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["extension", "build", str(tmp_path / "mine"), "--host", "http://h"]) == 1
    assert "is not a wick extension" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert main(["extension", "build", str(tmp_path / "ok"), "--host", "http://h"]) == 0
    assert "Load unpacked" in capsys.readouterr().out
