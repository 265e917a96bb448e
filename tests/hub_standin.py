"""A loopback stand-in of the Hugging Face Hub's HTTP API: the routes huggingface_hub calls to
fetch a model repo, serving repos a test builds in memory. Never the real Hub.

    hub = StandinHub()                                   # 127.0.0.1, a free port
    commit = hub.add("org/tiny", {"config.json": b"{...}", ...})
    hub.add("org/tiny", {...}, revision="v2")            # another branch
    hub.gate("org/tiny", tokens={"hf_good"})             # gated: 401/403 without a good token
    hub.cut_once("org/tiny", "model.safetensors", 1000)  # the next GET stops after 1000 bytes
    hub.url, hub.requests                                # HF_ENDPOINT, what was asked

Routes (huggingface_hub 1.x/2.x): ``GET /api/models/{repo}[/revision/{rev}]`` (model_info),
``GET /api/models/{repo}/tree/{rev}`` (list_repo_tree), ``HEAD|GET /{repo}/resolve/{rev}/{path}``
(file metadata: ETag, X-Repo-Commit, Content-Length; the bytes, with ``Range``). Errors carry
the Hub's ``X-Error-Code`` (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound), which is
how huggingface_hub tells them apart.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    revisions: dict[str, str] = field(default_factory=dict)  # branch / tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    gated: bool = False
    private: bool = False
    tokens: set[str] = field(default_factory=set)  # tokens that may read a gated / private repo


@dataclass
class Asked:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased


def _blob_oid(data: bytes) -> str:  # git's blob id
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandinHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Asked] = []
        self.down = False  # every request answers 503, as the Hub in an outage
        self._cuts: dict[tuple[str, str], int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- what a test sets up

    def add(self, repo_id: str, files: dict[str, bytes], revision: str = "main") -> str:
        """Commit ``files`` (the whole tree) to ``revision`` of ``repo_id``; the commit id."""
        repo = self.repos.setdefault(repo_id, Repo())
        digest = hashlib.sha1(f"{repo_id}@{revision}".encode())
        for name in sorted(files):
            digest.update(f"{name}\0{_blob_oid(files[name])}\n".encode())
        commit = digest.hexdigest()
        repo.commits[commit] = dict(files)
        repo.revisions[revision] = commit
        return commit

    def gate(self, repo_id: str, tokens: set[str], private: bool = False) -> None:
        repo = self.repos[repo_id]
        repo.gated, repo.private, repo.tokens = not private, private, set(tokens)

    def cut_once(self, repo_id: str, filename: str, after: int) -> None:
        """The next full GET of the file sends ``after`` bytes and drops the connection."""
        self._cuts[(repo_id, filename)] = after

    def asked(self, method: str, fragment: str) -> list[Asked]:
        return [r for r in self.requests if r.method == method and fragment in r.path]


def _handler(hub: StandinHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._route(body=True)

        def do_HEAD(self) -> None:
            self._route(body=False)

        # -- routing

        def _route(self, body: bool) -> None:
            hub.requests.append(Asked(self.command, self.path,
                                      {k.lower(): v for k, v in self.headers.items()}))
            if hub.down:
                return self._error(503, "ServiceUnavailable", "the Hub is down")
            path = unquote(urlsplit(self.path).path)
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/(.+?)(?:/(.*))?", path):
                return self._tree(m[1], m[2])
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path):
                return self._info(m[1], m[2] or "main")
            if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/(.+?)/(.+)", path):
                # a revision with slashes (refs/pr/1) arrives URL-encoded: split before unquote
                raw = urlsplit(self.path).path
                rm = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", raw)
                return self._resolve(unquote(rm[1]), unquote(rm[2]), unquote(rm[3]), body)
            self._error(404, "RepoNotFound", "no such route")

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            if repo.gated or repo.private:
                auth = self.headers.get("Authorization", "")
                token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
                if token not in repo.tokens:
                    if repo.private:
                        self._error(401, "RepoNotFound", "Repository not found")
                    else:
                        self._error(403 if token else 401, "GatedRepo",
                                    "Access to model is restricted")
                    return None
            return repo

        def _commit(self, repo: Repo, revision: str) -> str | None:
            commit = repo.revisions.get(revision) or (
                revision if revision in repo.commits else None)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return commit

        def _info(self, repo_id: str, revision: str) -> None:
            repo = self._repo(repo_id)
            commit = repo and self._commit(repo, revision)
            if not commit:
                return
            files = repo.commits[commit]
            self._json({"id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.private,
                        "gated": "auto" if repo.gated else False, "disabled": False,
                        "tags": [], "downloads": 0, "likes": 0,
                        "siblings": [{"rfilename": name} for name in sorted(files)]})

        def _tree(self, repo_id: str, revision: str) -> None:
            repo = self._repo(repo_id)
            commit = repo and self._commit(repo, revision)
            if not commit:
                return
            entries = []
            for name, data in sorted(repo.commits[commit].items()):
                sha = hashlib.sha256(data).hexdigest()
                entries.append({"type": "file", "path": name, "size": len(data),
                                "oid": _blob_oid(data),
                                "lfs": {"oid": sha, "size": len(data), "pointerSize": 130}})
            self._json(entries)

        def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id)
            commit = repo and self._commit(repo, revision)
            if not commit:
                return
            data = repo.commits[commit].get(name)
            if data is None:
                return self._error(404, "EntryNotFound", f"{name} does not exist")
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            start, status = 0, 200
            if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
                start, status = int(m[1]), 206
            self.send_response(status)
            self.send_header("ETag", etag)
            self.send_header("X-Linked-Etag", etag)
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            cut = hub._cuts.pop((repo_id, name), None) if start == 0 else None
            if cut is not None:  # a dropped connection mid-file
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data[start:])

        def _json(self, value) -> None:
            raw = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        def _error(self, status: int, code: str, message: str) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler


@contextmanager
def using(hub: StandinHub | str, cache: Path):
    """huggingface_hub in this process talks to ``hub`` (or a URL: a dead port for "no
    network"), caches in ``cache`` and knows no token, as ``HF_ENDPOINT`` / ``HF_HUB_CACHE``
    would set it at import (the tests' conftest imported it with HF_HUB_OFFLINE=1)."""
    import pytest
    from huggingface_hub import constants

    url = hub if isinstance(hub, str) else hub.url
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "ENDPOINT", url)
        patch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                      url + "/{repo_id}/resolve/{revision}/{filename}")
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_TOKEN_PATH", str(cache / "no-token"))
        patch.setattr(constants, "HF_STORED_TOKENS_PATH", str(cache / "no-tokens"))
        patch.delenv("HF_TOKEN", raising=False)
        patch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        yield patch


def process_env(hub: StandinHub, home: Path) -> dict[str, str]:
    """Environment variables of a wick process that fetches from ``hub``."""
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0",
            "TRANSFORMERS_OFFLINE": "0", "HF_TOKEN": "", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
