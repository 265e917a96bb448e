"""``hf://ORG/REPO[@REVISION][/PATH/FILE.gguf]``: a model on the Hugging Face Hub.

    fetched = fetch("hf://HuggingFaceTB/SmolLM2-135M-Instruct")
    fetched.kind    # "hf" (config.json + weights), "gguf" (one file) or "artifact" (wick's)
    fetched.path    # the snapshot directory, or the .gguf file, in huggingface_hub's cache
    fetched.origin  # "hf://ORG/REPO@<commit>[/FILE]": exactly these files, for the manifest

huggingface_hub does the fetching: its cache (shared with transformers), resumed downloads, its
progress bars, ``HF_TOKEN`` / ``hf auth login``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``. wick adds
what to fetch (only the files its loaders read: ``HF_PATTERNS``; all of an artifact repo; the
one ``.gguf``) and an error a user can act on for each way it fails. Where the Hub cannot be
reached (no network, ``HF_HUB_OFFLINE=1``, the Hub down), a repo fetched before is found in the
cache, as huggingface_hub's own functions do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..engine.artifact import MANIFEST_NAME
from ..engine.errors import InvalidRequestError, WickError

SCHEME = "hf://"
COMMIT = re.compile(r"[0-9a-f]{40}")  # a revision naming one commit: immutable

# What compiler/hf_source.py and embedding_files.py read from an HF model repo; the rest of a
# repo (README, other weight formats, ONNX and GGUF exports, images) is never downloaded.
HF_PATTERNS = [
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "chat_template.jinja", "chat_template.json", "*.safetensors", "model.safetensors.index.json",
    "modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
]  # fmt: skip
# a GPT-2-style tokenizer in its two files, in repos without a tokenizer.json (OPT's)
BPE_TOKENIZER_PATTERNS = ["vocab.json", "merges.txt", "special_tokens_map.json"]
# torch.save weights, in repos without safetensors (older ones: OPT's, many fine-tunes)
TORCH_WEIGHT_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def hf_patterns(tokenizer_json: bool, safetensors: bool,
                weights: list[str] | None = None) -> list[str]:
    """What to fetch of an HF repo, given whether it has a tokenizer.json and safetensors
    weights (each the older files' stand-in where it has not); ``weights``: its root
    safetensors files where the listing is known, of which a ``consolidated*`` copy beside
    the shards (Mistral's repos: the same weights again, in Mistral's own format) is left."""
    patterns = list(HF_PATTERNS)
    if weights is not None:
        shards = [w for w in weights if not w.startswith("consolidated")] or weights
        patterns = [p for p in patterns if p != "*.safetensors"] + shards
    if not tokenizer_json:
        patterns += BPE_TOKENIZER_PATTERNS
    if not safetensors:
        patterns += TORCH_WEIGHT_PATTERNS
    return patterns


def _is_safetensors(name: str) -> bool:
    return name.endswith(".safetensors") and "/" not in name


def _is_torch_weights(name: str) -> bool:
    return name.startswith("pytorch_model") and name.endswith(".bin") and "/" not in name


class HubAccessError(WickError):
    """The Hub refused the repo: gated or private, and no token (or one without access)."""

    default_status = 403
    default_type = "invalid_request_error"
    default_code = "model_access_denied"


class HubNotFoundError(WickError):
    """No such repo, revision or file (or a private repo this token cannot see)."""

    default_status = 404
    default_type = "invalid_request_error"
    default_code = "model_not_found"


class HubUnreachableError(WickError):
    """The Hub could not be asked and the cache does not hold what was asked."""

    default_status = 502
    default_type = "model_fetch_error"
    default_code = "hub_unreachable"


@dataclass(frozen=True, slots=True)
class Fetched:
    kind: str  # "hf", "gguf" or "artifact"
    path: Path  # a snapshot directory ("hf", "artifact") or the .gguf file
    repo_id: str  # "ORG/REPO": the model id
    origin: str  # hf://ORG/REPO@COMMIT[/FILE]


def is_hub_uri(model: str) -> bool:
    return model[: len(SCHEME)].lower() == SCHEME


@dataclass(frozen=True, slots=True)
class HubRef:
    uri: str  # as the user wrote it (for messages)
    repo_id: str
    revision: str | None
    filename: str | None


def parse(model: str) -> HubRef:
    """hf://ORG/REPO[@REVISION][/PATH] (``HF://`` too, as MLC-LLM writes it), by
    huggingface_hub's own parser (``refs/pr/N`` revisions included)."""
    from huggingface_hub.errors import HfUriError
    from huggingface_hub.utils import parse_hf_uri

    try:
        parsed = parse_hf_uri(SCHEME + model[len(SCHEME):])
    except HfUriError as err:
        raise InvalidRequestError(f"{model}: not a model on the Hub ({err.msg}). Write "
                                  "hf://ORG/REPO, hf://ORG/REPO@REVISION or "
                                  "hf://ORG/REPO/FILE.gguf", param="model") from None
    if parsed.type != "model":
        raise InvalidRequestError(f"{model} is a {parsed.type} repo; wick runs model repos "
                                  "(hf://ORG/REPO)", param="model")
    filename = parsed.path_in_repo.strip("/") or None
    if filename is not None and not filename.endswith(".gguf"):
        raise InvalidRequestError(
            f"{model}: a path inside a repo must name a .gguf file; for a repo of config.json "
            f"and safetensors write hf://{parsed.id}", param="model")
    return HubRef(model, parsed.id, parsed.revision, filename)


def fetch(model: str) -> Fetched:
    """Download (or find in the cache) what wick needs of ``model``, an ``hf://`` URI."""
    ref = parse(model)
    if ref.filename is not None:
        return _named_gguf(ref)
    if ref.revision is not None and COMMIT.fullmatch(ref.revision) and _cached(ref):
        try:  # a commit never changes: nothing to ask the Hub, unless the cache lacks a file
            return _from_cache(ref, None)
        except HubUnreachableError:
            pass
    try:
        files = _listing(ref)
    except _NoAnswer as no_answer:  # the Hub could not be asked: what the cache holds
        return _from_cache(ref, no_answer.cause)
    kind, names = _kind(ref, files)
    if kind == "gguf":
        return _gguf(ref, names[0])
    safetensors = [f for f in files if _is_safetensors(f)]
    folder = _snapshot(ref, None if kind == "artifact" else hf_patterns(
        "tokenizer.json" in files, bool(safetensors), safetensors))
    return _fetched(kind, Path(folder), ref)


class _NoAnswer(Exception):
    def __init__(self, cause: BaseException) -> None:
        self.cause = cause


def _listing(ref: HubRef) -> list[str]:
    """The repo's file names at the revision; ``_NoAnswer`` where the Hub cannot be asked now
    (no network, offline mode, the Hub down, or a repo fetched before with a token)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        info = HfApi().model_info(ref.repo_id, revision=ref.revision)
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        if _cached(ref):  # (gated or private, fetched with a token once)
            raise _NoAnswer(err) from None
        raise _hub_error(ref, err) from None
    except HfHubHTTPError as err:  # (an OSError too: before the clause below)
        if err.response is not None and err.response.status_code < 500:
            raise _hub_error(ref, err) from None
        raise _NoAnswer(err) from None  # the Hub is down: the cache may do
    except (OfflineModeIsEnabled, OSError) as err:  # (OSError: no network)
        raise _NoAnswer(err) from None
    except Exception as err:  # noqa: BLE001 - httpx's ConnectError, TimeoutException, ...
        if _network_error(err):
            raise _NoAnswer(err) from None
        raise
    return [s.rfilename for s in info.siblings or []]


def _kind(ref: HubRef, files: list[str]) -> tuple[str, list[str]]:
    """What the repo holds: ("artifact" | "hf" | "gguf", the files that say so)."""
    if MANIFEST_NAME in files:
        return "artifact", [MANIFEST_NAME]
    if "config.json" in files and any(_is_safetensors(f) or _is_torch_weights(f) for f in files):
        return "hf", ["config.json"]
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return "gguf", ggufs
    if ggufs:
        shown = ", ".join(ggufs[:6]) + (f" (and {len(ggufs) - 6} more)" if len(ggufs) > 6 else "")
        raise InvalidRequestError(
            f"{ref.uri} holds {len(ggufs)} GGUF files ({shown}): name one, as "
            f"hf://{ref.repo_id}/{ggufs[0]}", param="model")
    raise InvalidRequestError(
        f"{ref.uri} holds no model wick reads: config.json with *.safetensors (or "
        f"pytorch_model.bin), a .gguf file, "
        f"or a compiled wick artifact ({MANIFEST_NAME})", param="model")


def _from_cache(ref: HubRef, cause: BaseException | None) -> Fetched:
    """The repo as fetched before (without asking the Hub: it could not be asked, ``cause``,
    or the revision is a commit): its kind from the files the cache holds at the revision."""
    if _cached(ref, MANIFEST_NAME):
        return _fetched("artifact", Path(_snapshot(ref, None, True, cause)), ref)
    if _cached(ref, "config.json"):
        patterns = hf_patterns(_cached(ref, "tokenizer.json"),
                               _cached(ref, "model.safetensors", "model.safetensors.index.json"))
        return _fetched("hf", Path(_snapshot(ref, patterns, True, cause)), ref)
    folder = Path(_snapshot(ref, ["*.gguf"], True, cause))
    ggufs = sorted(p for p in folder.rglob("*.gguf"))
    if not ggufs:
        raise _unreachable(ref, cause)
    names = [p.relative_to(folder).as_posix() for p in ggufs]
    _kind(ref, names)  # several: name one
    return _fetched("gguf", ggufs[0], ref, names[0])


def _snapshot(ref: HubRef, patterns: list[str] | None, cached_only: bool = False,
              cause: BaseException | None = None) -> str:
    """The snapshot of the repo's files matching ``patterns`` (None: all); ``cached_only``:
    from the cache alone (``cause``: why the Hub was not asked, for the error)."""
    from huggingface_hub import snapshot_download

    return _calling(ref, lambda: snapshot_download(
        ref.repo_id, revision=ref.revision, allow_patterns=patterns,
        local_files_only=cached_only), cause)


def _named_gguf(ref: HubRef) -> Fetched:
    """A GGUF file the URI names: from the cache at a commit without a request; else the Hub
    is asked for the repo first (one request, which fails at once without network, where
    hf_hub_download's own request is retried five times, 23 s, logging each), and the cache
    serves where it cannot be asked."""
    from huggingface_hub import try_to_load_from_cache

    def cached() -> Fetched | None:
        path = try_to_load_from_cache(ref.repo_id, ref.filename, revision=ref.revision)
        return _fetched("gguf", Path(path), ref, ref.filename) if isinstance(path, str) else None

    if ref.revision is not None and COMMIT.fullmatch(ref.revision) and (hit := cached()):
        return hit
    try:
        _listing(ref)
    except _NoAnswer as no_answer:
        if hit := cached():
            return hit
        raise _unreachable(ref, no_answer.cause) from None
    return _gguf(ref, ref.filename)


def _gguf(ref: HubRef, filename: str) -> Fetched:
    from huggingface_hub import hf_hub_download

    path = _calling(ref, lambda: hf_hub_download(ref.repo_id, filename, revision=ref.revision))
    return _fetched("gguf", Path(path), ref, filename)


def _fetched(kind: str, path: Path, ref: HubRef, filename: str | None = None) -> Fetched:
    # huggingface_hub's cache: .../snapshots/<commit>/<file in repo>
    parts = path.parts
    commit = parts[parts.index("snapshots") + 1] if "snapshots" in parts else ref.revision
    origin = f"{SCHEME}{ref.repo_id}" + (f"@{commit}" if commit else "")
    if filename is not None:
        origin += f"/{filename}"
    return Fetched(kind, path, ref.repo_id, origin)


def _cached(ref: HubRef, *names: str) -> bool:
    """Whether the cache holds one of ``names`` (default: what says a repo was fetched: an
    artifact's manifest or a model's config) at the revision."""
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(ref.repo_id, name, revision=ref.revision), str)
               for name in names or (MANIFEST_NAME, "config.json"))


def _calling(ref: HubRef, call: Callable[[], str], offline: BaseException | None = None) -> str:
    """``call()``, huggingface_hub's exceptions turned into wick's errors (``offline``: why
    the Hub was not asked, for the message where the cache does not hold the files)."""
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        return call()
    except LocalEntryNotFoundError as err:
        raise _unreachable(ref, offline or err.__cause__) from None
    except (HfHubHTTPError, EntryNotFoundError) as err:
        raise _hub_error(ref, err) from None
    except OSError as err:  # a cut connection, a full disk
        raise HubUnreachableError(f"fetching {ref.uri} failed ({_first_line(err)}); run the "
                                  "command again to resume the download") from None


def _hub_error(ref: HubRef, err: Exception) -> WickError:
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{constants.ENDPOINT}/{ref.repo_id}"
    token = get_token() is not None
    if isinstance(err, GatedRepoError):
        how = ("the token wick found (HF_TOKEN or `hf auth login`) has no access: accept the "
               f"model's terms at {page} with that account" if token else
               f"accept the model's terms at {page}, then set HF_TOKEN to a token of that "
               "account (or run `hf auth login`)")
        return HubAccessError(f"{ref.uri} is a gated model: {how}", param="model",
                              code="model_gated")
    if isinstance(err, RevisionNotFoundError):
        return HubNotFoundError(
            f"{ref.uri}: the repo has no revision '{ref.revision}' (a branch, tag or commit)",
            param="model", code="revision_not_found")
    if isinstance(err, EntryNotFoundError):
        return HubNotFoundError(
            f"{ref.uri}: the repo has no file '{ref.filename}' at {ref.revision or 'main'}; "
            f"see {page}/tree/{ref.revision or 'main'}", param="model", code="file_not_found")
    if isinstance(err, RepositoryNotFoundError):
        private = ("the token wick found cannot see it either" if token else
                   "if it is private, set HF_TOKEN to a token that can read it (or run "
                   "`hf auth login`)")
        return HubNotFoundError(
            f"{ref.uri}: no such model repo on {constants.ENDPOINT} ({private})", param="model")
    status = getattr(getattr(err, "response", None), "status_code", None)
    return HubUnreachableError(f"{constants.ENDPOINT} answered {status} for {ref.uri} "
                               f"({_first_line(err)}); try again later")


def _unreachable(ref: HubRef, cause: BaseException | None) -> WickError:
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    if isinstance(cause, OfflineModeIsEnabled) or constants.HF_HUB_OFFLINE:
        return HubUnreachableError(
            f"{ref.uri} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
            "HF_HUB_OFFLINE is set: fetch it once with the network on (unset HF_HUB_OFFLINE)")
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(cause, HfHubHTTPError) or (
            cause is not None and not isinstance(cause, OSError) and not _network_error(cause)):
        return _hub_error(ref, cause)  # it answered: what it said
    why = f" ({_first_line(cause)})" if cause is not None else ""
    return HubUnreachableError(
        f"cannot reach {constants.ENDPOINT}{why} and {ref.uri} is not in the Hugging Face "
        f"cache ({constants.HF_HUB_CACHE}): check the network (or HF_ENDPOINT, proxy settings)")


def _network_error(err: BaseException) -> bool:
    """httpx's transport errors (ConnectError, TimeoutException, ...): not OSErrors."""
    return type(err).__module__.split(".")[0] in ("httpx", "httpcore", "httpx2")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
