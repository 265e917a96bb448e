"""``GET /artifacts/<id>/<path>``: caching headers, ranges, and nothing outside the artifact root.

A hand-built artifact directory (manifest listing files with their sha256) behind a live
uvicorn server; raw request paths go out through ``http.client``, which (unlike httpx) sends
``..`` and percent-escapes exactly as written.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
from pathlib import Path

import pytest

from wick.server.app import ModelPool, create_app
from wick.server.artifact_host import (
    ArtifactHost,
    ByteRange,
    RangeNotSatisfiable,
    etag_matches,
    parse_range,
)
from wick.server.serve import ServerThread

ART = "demo-q0f32-0123456789abcdef"
SHARD = bytes(range(256)) * 40  # 10240 bytes
KERNEL = b"@compute @workgroup_size(64) fn main() {}\n"
TOKENIZER = b'{"model": {"type": "BPE"}}'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("host")
    root = base / "artifacts"
    art = root / ART
    (art / "params").mkdir(parents=True)
    (art / "kernels" / "webgpu").mkdir(parents=True)
    (art / "params" / "shard-00000.bin").write_bytes(SHARD)
    (art / "kernels" / "webgpu" / "main.wgsl").write_bytes(KERNEL)
    (art / "tokenizer.json").write_bytes(TOKENIZER)
    (art / "notes.txt").write_bytes(b"not in the manifest")
    manifest = {
        "format": 2, "model_id": "demo", "quantization": "q0f32",
        "kernel_sets": {"webgpu": {"form": "shaders", "kernels": [
            {"name": "main", "file": "kernels/webgpu/main.wgsl", "sha256": sha(KERNEL)}]}},
        "shards": [{"file": "params/shard-00000.bin", "nbytes": len(SHARD),
                    "sha256": sha(SHARD)}],
        "tokenizer": {"file": "tokenizer.json", "sha256": sha(TOKENIZER)},
    }
    (art / "wick-artifact.json").write_text(json.dumps(manifest))
    secret = base / "secret.txt"
    secret.write_text("outside the root")
    os.symlink(secret, art / "params" / "escape.bin")  # a symlink leading out
    os.symlink(art / "tokenizer.json", art / "tok-link.json")  # one staying inside
    outside = base / "elsewhere-q0f32-1"  # an artifact dir outside the root ...
    outside.mkdir()
    (outside / "wick-artifact.json").write_text("{}")
    os.symlink(outside, root / "linked-q0f32-1")  # ... reached by a symlink: not served
    tmp = root / "demo-q0f32-.tmp-123"
    tmp.mkdir()
    (tmp / "wick-artifact.json").write_text("{}")
    served = base / "served" / "mymodel-q0f32-2"  # a served model's artifact outside the root
    served.mkdir(parents=True)
    (served / "wick-artifact.json").write_text('{"format": 1}')
    return {"root": root, "art": art, "secret": secret, "served": served}


@pytest.fixture(scope="module")
def server(tree):
    host = ArtifactHost(tree["root"])
    host.add(tree["served"])
    live = ServerThread(create_app(ModelPool.of(), artifacts=host))
    yield live
    live.stop()


def get(server, path: str, headers: dict[str, str] | None = None, method: str = "GET"):
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_manifest_is_revalidated_with_its_etag(server, tree):
    status, headers, body = get(server, f"/artifacts/{ART}/wick-artifact.json")
    assert status == 200
    assert body == (tree["art"] / "wick-artifact.json").read_bytes()
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-cache"
    assert headers["etag"] == f'"{sha(body)}"'
    status, headers2, body = get(server, f"/artifacts/{ART}/wick-artifact.json",
                                 {"If-None-Match": headers["etag"]})
    assert status == 304 and body == b"" and headers2["etag"] == headers["etag"]


@pytest.mark.parametrize("path, data, ctype", [
    ("params/shard-00000.bin", SHARD, "application/octet-stream"),
    ("kernels/webgpu/main.wgsl", KERNEL, "text/wgsl"),
    ("tokenizer.json", TOKENIZER, "application/json"),
])
def test_listed_files_are_immutable_with_the_manifest_sha256(server, path, data, ctype):
    status, headers, body = get(server, f"/artifacts/{ART}/{path}")
    assert status == 200 and body == data
    assert headers["etag"] == f'"{sha(data)}"'
    assert headers["cache-control"] == "public, max-age=31536000, immutable"
    assert headers["content-type"].startswith(ctype)
    assert headers["accept-ranges"] == "bytes"
    assert int(headers["content-length"]) == len(data)
    for inm in (headers["etag"], f'"other", W/{headers["etag"]}', "*"):
        assert get(server, f"/artifacts/{ART}/{path}", {"If-None-Match": inm})[0] == 304
    assert get(server, f"/artifacts/{ART}/{path}", {"If-None-Match": '"other"'})[0] == 200


def test_unlisted_file_gets_a_content_etag_and_no_cache(server):
    status, headers, body = get(server, f"/artifacts/{ART}/notes.txt")
    assert status == 200 and headers["etag"] == f'"{sha(body)}"'
    assert headers["cache-control"] == "no-cache"


@pytest.mark.parametrize("range_header, start, end", [
    ("bytes=0-99", 0, 99),
    ("bytes=1000-", 1000, len(SHARD) - 1),
    ("bytes=-16", len(SHARD) - 16, len(SHARD) - 1),
    ("bytes=10000-99999", 10000, len(SHARD) - 1),
])
def test_ranges(server, range_header, start, end):
    status, headers, body = get(server, f"/artifacts/{ART}/params/shard-00000.bin",
                                {"Range": range_header})
    assert status == 206
    assert body == SHARD[start:end + 1]
    assert headers["content-range"] == f"bytes {start}-{end}/{len(SHARD)}"
    assert int(headers["content-length"]) == end - start + 1


def test_unsatisfiable_and_ignored_ranges(server):
    path = f"/artifacts/{ART}/params/shard-00000.bin"
    status, headers, body = get(server, path, {"Range": f"bytes={len(SHARD)}-"})
    assert status == 416 and headers["content-range"] == f"bytes */{len(SHARD)}"
    assert json.loads(body)["error"]["code"] == "range_not_satisfiable"
    assert get(server, path, {"Range": "bytes=-0"})[0] == 416
    status, _, body = get(server, path, {"Range": "bytes=-" + "7" * 4301})  # was a 500
    assert status == 416 and json.loads(body)["error"]["code"] == "range_not_satisfiable"
    for ignored in ("bytes=0-1,5-6", "items=0-1", "bytes=9-3"):
        status, _, body = get(server, path, {"Range": ignored})
        assert status == 200 and body == SHARD
    etag = f'"{sha(SHARD)}"'  # If-Range: the range only while the file is unchanged
    assert get(server, path, {"Range": "bytes=0-9", "If-Range": etag})[0] == 206
    assert get(server, path, {"Range": "bytes=0-9", "If-Range": '"stale"'})[0] == 200


def test_head(server):
    status, headers, body = get(server, f"/artifacts/{ART}/params/shard-00000.bin",
                                method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) == len(SHARD)


@pytest.mark.parametrize("path", [
    f"/artifacts/{ART}/../{ART}/tokenizer.json",
    f"/artifacts/{ART}/../../secret.txt",
    f"/artifacts/{ART}/params/../../secret.txt",
    f"/artifacts/{ART}/%2e%2e/%2e%2e/secret.txt",
    f"/artifacts/{ART}/%2E%2E%2F%2E%2E%2Fsecret.txt",
    f"/artifacts/{ART}/params%2Fshard-00000.bin",
    f"/artifacts/{ART}/params%2fshard-00000.bin",
    f"/artifacts/{ART}/params%5Cshard-00000.bin",
    f"/artifacts/{ART}/params\\shard-00000.bin",
    f"/artifacts/{ART}/./tokenizer.json",
    f"/artifacts/{ART}//tokenizer.json",
    f"/artifacts/{ART}/%2Fetc/passwd",
    f"/artifacts/{ART}//etc/passwd",
    f"/artifacts/{ART}/tokenizer.json%00.bin",
    f"/artifacts/{ART}/params/escape.bin",
    f"/artifacts/{ART}/params",
    f"/artifacts/{ART}/",
    f"/artifacts/../artifacts/{ART}/tokenizer.json",
    "/artifacts/%2e%2e/secret.txt",
    "/artifacts/linked-q0f32-1/wick-artifact.json",
    "/artifacts/demo-q0f32-.tmp-123/wick-artifact.json",
    "/artifacts/no-such-artifact/wick-artifact.json",
    f"/artifacts/{ART}/missing.bin",
    "/artifacts/.../wick-artifact.json",
    "/artifacts/" + "a" * 300 + "/x",  # a name the filesystem refuses (too long): not a 500
    f"/artifacts/{ART}/" + "b" * 300,
])
def test_nothing_outside_the_root_is_reachable(server, path):
    status, headers, body = get(server, path)
    assert status == 404, (path, body[:80])
    assert b"outside the root" not in body
    err = json.loads(body)["error"]
    assert err["code"] == "not_found" and set(err) == {"message", "type", "param", "code"}


def test_symlink_inside_the_artifact_is_served(server):
    status, _, body = get(server, f"/artifacts/{ART}/tok-link.json")
    assert status == 200 and body == TOKENIZER


def test_registered_artifact_outside_the_root(server):
    status, headers, body = get(server, "/artifacts/mymodel-q0f32-2/wick-artifact.json")
    assert status == 200 and body == b'{"format": 1}'


def test_resolve_directly(tree):
    host = ArtifactHost(tree["root"])
    assert host.resolve(ART, "tokenizer.json").size == len(TOKENIZER)
    assert host.resolve(ART, "params/escape.bin") is None
    assert host.resolve(ART, "tokenizer.json", b"/artifacts/x/%2e/tokenizer.json") is None
    assert host.resolve("..", "secret.txt") is None
    assert ArtifactHost(None).resolve(ART, "tokenizer.json") is None  # no root: nothing


def test_parse_range_and_etags():
    assert parse_range("bytes=0-0", 10) == ByteRange(0, 0)
    assert parse_range("bytes=-100", 10) == ByteRange(0, 9)
    assert parse_range("bytes=5-", 10) == ByteRange(5, 9)
    assert parse_range("bytes=-", 10) is None
    assert parse_range("bytes=abc", 10) is None
    with pytest.raises(RangeNotSatisfiable):
        parse_range("bytes=10-", 10)
    with pytest.raises(RangeNotSatisfiable):
        parse_range("bytes=-5", 0)
    # strictly ASCII digits, and no more of them than an offset can have (the outside probe:
    # "bytes=-" + 4,301 digits was a 500, int() refusing them)
    for huge in ("bytes=-" + "9" * 4301, "bytes=" + "1" * 19 + "-", "bytes=0-" + "9" * 30):
        with pytest.raises(RangeNotSatisfiable):
            parse_range(huge, 10)
    assert parse_range("bytes=-" + "9" * 18, 10) == ByteRange(0, 9)
    assert parse_range("bytes=\u0663-", 10) is None and parse_range("bytes=-\u00b2", 10) is None
    assert etag_matches('W/"abc"', '"abc"') and not etag_matches('"ab"', '"abc"')
