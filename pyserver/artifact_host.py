"""``GET /artifacts/<artifact-id>/<path>``: compiled artifact files for browsers and other hosts.

An artifact id is an artifact directory's name: one directly under ``artifacts_dir()`` (with a
manifest, not a ``.tmp-`` build) or one registered explicitly (the directories of served models
that live elsewhere). Responses are cache-friendly and safe:

- strong ETags: the sha256 the manifest lists for shards, kernels and the tokenizer, else the
  sha256 of the file's bytes (computed once per size+mtime);
- files listed in the manifest with a sha256 are content-addressed:
  ``Cache-Control: public, max-age=31536000, immutable``; the manifest and anything else:
  ``no-cache`` (revalidate with the ETag);
- ``If-None-Match`` -> 304; one ``Range: bytes=...`` -> 206 with ``Content-Range``, an
  unsatisfiable one -> 416 (several ranges -> the whole file, as RFC 9110 allows);
- nothing outside the artifact directory is reachable: ``..``, empty or dot segments,
  backslashes, NUL, percent-encoded ``/`` ``\\`` ``.`` in the raw path, symlinks resolving
  outside the directory (but for a huggingface_hub snapshot's links into its repo's blobs), and
  names the filesystem refuses (too long) all answer 404, exactly like a missing file;
- a served manifest names its source by name only: the local path a model was compiled from
  (``source.model``) is cut to its last component (an ``hf://`` source is kept whole).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..engine.artifact import MANIFEST_NAME, kernel_files

IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
CHUNK = 1 << 20
CONTENT_TYPES = {
    ".json": "application/json",
    ".wgsl": "text/wgsl; charset=utf-8",
    ".bin": "application/octet-stream",
}
_ENCODED_SEPARATOR = re.compile(rb"%(2f|5c|2e|00)", re.IGNORECASE)
_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")  # ASCII digits only ("٣" is no offset)
MAX_OFFSET_DIGITS = 18  # past any file's size (and int()'s 4,300-digit limit)


@dataclass(frozen=True, slots=True)
class ArtifactFile:
    path: Path  # resolved, inside the artifact directory
    size: int
    etag: str  # quoted, strong
    cache_control: str
    content_type: str
    data: bytes | None = None  # the bytes to send instead of the file's (a scrubbed manifest)

    def chunks(self, start: int, length: int) -> Iterator[bytes]:
        if self.data is not None:
            return iter((self.data[start:start + length],))
        return read_chunks(self.path, start, length)


@dataclass(frozen=True, slots=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


class RangeNotSatisfiable(Exception):
    pass


class ArtifactHost:
    """Resolves ``(artifact_id, relative path)`` to a servable file, or ``None`` (-> 404)."""

    def __init__(self, root: Path | None = None, extra: Mapping[str, Path] | None = None) -> None:
        self.root = root.resolve() if root is not None else None
        self.extra = {name: Path(p).resolve() for name, p in (extra or {}).items()}
        self._manifest_hashes: dict[Path, tuple[int, dict[str, str]]] = {}  # dir -> (mtime, map)
        self._file_hashes: dict[Path, tuple[int, int, str]] = {}  # path -> (size, mtime, hex)
        # variants being compiled for browsers: (model, quantization) -> progress, or error
        self._preparing: dict[tuple[str, str], dict] = {}

    def set_preparing(self, model: str, quantization: str, **state) -> None:
        """Announce (or update) a variant being built: ``stage``/``done``/``total``, or
        ``error`` once it failed. ``add()`` of the finished artifact should follow."""
        self._preparing[(model, quantization)] = {"model": model, "quantization": quantization,
                                                  "features": [], **state}

    def done_preparing(self, model: str, quantization: str) -> None:
        self._preparing.pop((model, quantization), None)

    def preparing(self) -> list[dict]:
        return [dict(v) for v in self._preparing.values()]

    def add(self, artifact_dir: str | Path) -> str:
        """Serve ``artifact_dir`` (a served model's artifact outside the root) by its name."""
        path = Path(artifact_dir).resolve()
        self.extra[path.name] = path
        return path.name

    def artifacts(self) -> list[dict]:
        """Every servable artifact: ``{id, model, quantization, features, fallback, task,
        kernel_sets}`` (the browser engine's model index, ``GET /web/models.json``).
        Unreadable manifests are skipped."""
        # the served models' artifacts first, then the newest compile first: the browser picks
        # the first entry that matches a model and quantization
        dirs: dict[str, Path] = dict(self.extra)
        if self.root is not None and self.root.is_dir():
            found = [d for d in self.root.iterdir()
                     if d.is_dir() and ".tmp-" not in d.name and (d / MANIFEST_NAME).is_file()]
            for d in sorted(found, key=lambda d: (d / MANIFEST_NAME).stat().st_mtime, reverse=True):
                dirs.setdefault(d.name, d)
        out = []
        for name, d in dirs.items():
            try:
                m = json.loads((d / MANIFEST_NAME).read_text())
                out.append({"id": name, "model": m["model_id"], "quantization": m["quantization"],
                            "features": list(m.get("requires", {}).get("features", [])),
                            "fallback": list(m.get("requires", {}).get("fallback", [])),
                            # (the browser turns to the backend whose set is there)
                            "kernel_sets": sorted(m.get("kernel_sets", {})),
                            # "generate" or "embed" (the chat page lists the former)
                            "task": m.get("model", {}).get("task", "generate")})
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def artifact_dir(self, artifact_id: str) -> Path | None:
        if artifact_id in self.extra:
            return self.extra[artifact_id]
        if (self.root is None or not _plain_segment(artifact_id) or ".tmp-" in artifact_id):
            return None
        path = self.root / artifact_id
        try:
            if path.is_symlink() or not (path / MANIFEST_NAME).is_file():
                return None
            return path.resolve()
        except OSError:  # a name the filesystem refuses (too long, ...) names nothing
            return None

    def resolve(self, artifact_id: str, rel_path: str, raw_path: bytes = b"") -> ArtifactFile | None:
        """The file ``rel_path`` (percent-decoded) of artifact ``artifact_id``; ``raw_path`` is
        the request's undecoded path, checked for encoded separators and dots."""
        try:
            return self._resolve(artifact_id, rel_path, raw_path)
        except OSError:  # too long a name, a file vanishing meanwhile: not found, never a 500
            return None

    def _resolve(self, artifact_id: str, rel_path: str, raw_path: bytes) -> ArtifactFile | None:
        if _ENCODED_SEPARATOR.search(raw_path):
            return None
        base = self.artifact_dir(artifact_id)
        if base is None:
            return None
        parts = rel_path.split("/")
        if not all(_plain_segment(p) for p in parts):
            return None
        target = base.joinpath(*parts)
        try:
            real = target.resolve(strict=True)
        except (OSError, RuntimeError):  # missing, or a symlink loop
            return None
        if not (real.is_relative_to(base) or _hub_blob_of(base, real)) or not real.is_file():
            return None
        rel = "/".join(parts)
        st = real.stat()
        if rel == MANIFEST_NAME:
            data = scrub_manifest(real.read_bytes())
            return ArtifactFile(real, len(data), f'"{hashlib.sha256(data).hexdigest()}"',
                                REVALIDATE, CONTENT_TYPES[".json"], data)
        listed = self._listed_hashes(base).get(rel)
        if listed is not None:
            etag, cache = listed, IMMUTABLE
        else:
            etag, cache = self._file_sha256(real, st), REVALIDATE
        return ArtifactFile(real, st.st_size, f'"{etag}"', cache,
                            CONTENT_TYPES.get(real.suffix, "application/octet-stream"))

    def _listed_hashes(self, base: Path) -> dict[str, str]:
        """``relative path -> sha256`` for every file the manifest lists with a hash."""
        manifest = base / MANIFEST_NAME
        try:
            mtime = manifest.stat().st_mtime_ns
        except OSError:
            return {}
        cached = self._manifest_hashes.get(base)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            data = json.loads(manifest.read_bytes())
        except (OSError, ValueError):
            return {}
        hashes: dict[str, str] = {}
        entries = []
        if isinstance(data, dict):
            if isinstance(data.get("shards"), list):
                entries += data["shards"]
            entries.append(data.get("tokenizer"))
            sets = data.get("kernel_sets")
            for entry in (sets.values() if isinstance(sets, dict) else ()):
                try:
                    entries += kernel_files(entry)
                except (KeyError, TypeError):  # (a malformed set: its files get no ETag)
                    continue
        for e in entries:
            if isinstance(e, dict) and isinstance(e.get("file"), str) \
                    and isinstance(e.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", e["sha256"]):
                hashes[e["file"]] = e["sha256"]
        self._manifest_hashes[base] = (mtime, hashes)
        return hashes

    def _file_sha256(self, path: Path, st: os.stat_result) -> str:
        cached = self._file_hashes.get(path)
        if cached is not None and cached[:2] == (st.st_size, st.st_mtime_ns):
            return cached[2]
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
        self._file_hashes[path] = (st.st_size, st.st_mtime_ns, digest.hexdigest())
        return digest.hexdigest()


def scrub_manifest(raw: bytes) -> bytes:
    """The manifest as served: ``source.model`` cut to its last path component (a local path
    says where the operator keeps files; the name is all a client needs). Other bytes are
    kept as they are, so an unreadable manifest is served unchanged."""
    try:
        manifest = json.loads(raw)
        model = manifest["source"]["model"]
    except (ValueError, KeyError, TypeError):
        return raw
    if not isinstance(model, str) or ("/" not in model and "\\" not in model) or (
            model.startswith("hf://")):  # (public: where anyone may fetch the same files)
        return raw
    manifest["source"]["model"] = re.split(r"[/\\]", model.rstrip("/\\"))[-1]
    return json.dumps(manifest, indent=1).encode()


def _hub_blob_of(base: Path, real: Path) -> bool:
    """Whether ``real`` is a file of the snapshot ``base`` in huggingface_hub's cache: its
    files are symlinks into the repo's ``blobs/`` (an hf:// artifact repo, served as it is)."""
    return base.parent.name == "snapshots" and real.parent == base.parent.parent / "blobs"


def _plain_segment(segment: str) -> bool:
    return (segment not in ("", ".", "..") and "\\" not in segment and "\x00" not in segment
            and "/" not in segment and ":" not in segment)


def etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison for If-None-Match (``*`` matches anything)."""
    tags = [t.strip() for t in if_none_match.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)


def parse_range(header: str, size: int) -> ByteRange | None:
    """One byte range, or None to send the whole file (absent, malformed, or several ranges).
    Raises ``RangeNotSatisfiable`` for a well-formed range outside the file, or with a number
    of more digits than any offset has."""
    m = _RANGE.match(header.strip())
    if m is None:
        return None
    first, last = m.groups()
    if first == "" and last == "":
        return None
    if max(len(first), len(last)) > MAX_OFFSET_DIGITS:
        raise RangeNotSatisfiable
    if first == "":  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise RangeNotSatisfiable
        return ByteRange(max(0, size - n), size - 1)
    start = int(first)
    end = size - 1 if last == "" else min(int(last), size - 1)
    if last != "" and int(last) < start:
        return None  # invalid syntax: ignore the header
    if start >= size:
        raise RangeNotSatisfiable
    return ByteRange(start, end)


def read_chunks(path: Path, start: int, length: int) -> Iterator[bytes]:
    """The bytes [start, start + length) in pieces of at most ``CHUNK``."""
    with path.open("rb") as f:
        f.seek(start)
        left = length
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block
