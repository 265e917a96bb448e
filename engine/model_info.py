"""What the engine needs to know about a model, read from the artifact manifest.

The manifest (``wick-artifact.json``) has top-level ``model_id`` and ``quantization`` and a
``model`` section written by the compiler; this module only reads, never guesses: a missing or
mistyped key is an ``ArtifactError`` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .artifact import MANIFEST_NAME
from .errors import ArtifactError
from .sampling_defaults import read_values


def model_names(model_id: str, quantization: str) -> tuple[str, str]:
    """The names a compiled model answers to: its model id (what /v1/models lists, as vLLM
    does) and ``<model id>-<quantization>`` (one variant of several). A compiled artifact also
    answers to its own id (its directory's name). web/src/model_names.ts is the browser's copy
    (tests/browser/test_build_and_routes.py runs both on the same names)."""
    return model_id, f"{model_id}-{quantization}"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model_id: str  # e.g. "SmolLM2-135M-Instruct"
    quantization: str  # e.g. "q4f16_1"
    family: str  # e.g. "llama"
    vocab_size: int
    context_window: int  # max tokens (prompt + completion) per sequence
    page_size: int = 16  # tokens per KV page, fixed by the compiled kernels
    prefill_chunk_size: int = 2048  # max new tokens per step (the compiled prefill's bound)
    max_batch_size: int = 32  # max sequences per step (the compiled decode's bound)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    add_bos_token: bool = False
    chat_template: str | None = None
    # every layer attends to at most the last kv_window tokens: the KV cache frees older pages
    kv_window: int | None = None
    # global layers and layers windowed to this many tokens, each kind with its own page pool
    kv_window_pool: int | None = None
    # "generate", or "embed": the model returns one vector per input (``embedding`` says how
    # it pools, its size, its longest input and the special tokens around one)
    task: str = "generate"
    embedding: dict[str, Any] | None = None
    # what a request that leaves sampling fields unset gets ({"values", "source"}: the
    # checkpoint's generation_config.json or the registry's model card; engine/sampling_defaults)
    sampling_defaults: dict[str, Any] | None = None

    @property
    def names(self) -> tuple[str, str]:
        """The names this model answers to (``model_names``)."""
        return model_names(self.model_id, self.quantization)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_window", "page_size", "prefill_chunk_size",
                     "max_batch_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ArtifactError(f"model.{name} must be a positive integer, got {value!r}",
                                    path=MANIFEST_NAME)
        if self.bos_token_id is not None and not self._valid_token(self.bos_token_id):
            raise ArtifactError(f"model.bos_token_id {self.bos_token_id!r} is not a token id "
                                f"below vocab_size {self.vocab_size}", path=MANIFEST_NAME)
        eos = tuple(self.eos_token_ids)
        if not all(self._valid_token(t) for t in eos):
            raise ArtifactError(f"model.eos_token_ids {list(eos)!r} must be token ids below "
                                f"vocab_size {self.vocab_size}", path=MANIFEST_NAME)
        object.__setattr__(self, "eos_token_ids", eos)
        for name in ("kv_window", "kv_window_pool"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ArtifactError(f"model.{name} must be a positive integer or null, got "
                                    f"{value!r}", path=MANIFEST_NAME)
        if self.task not in ("generate", "embed"):
            raise ArtifactError(f"model.task must be 'generate' or 'embed', got {self.task!r}",
                                path=MANIFEST_NAME)
        if self.task == "embed":
            e = self.embedding
            ok = isinstance(e, dict) and all(_is_int(e.get(k)) and e[k] > 0 for k in
                                             ("dimensions", "max_input_tokens"))
            ok = ok and all(isinstance(e.get(k), list) and all(self._valid_token(t) for t in e[k])
                            for k in ("prefix_ids", "suffix_ids"))
            if not ok:
                raise ArtifactError("model.embedding must give dimensions, max_input_tokens, "
                                    "prefix_ids and suffix_ids", path=MANIFEST_NAME)
        d = self.sampling_defaults
        if d is not None and not (isinstance(d, dict) and isinstance(d.get("values"), dict)
                                  and isinstance(d.get("source"), str)):
            raise ArtifactError("model.sampling_defaults must be null or {values, source}",
                                path=MANIFEST_NAME)
        if d is not None:  # (only values a request could give)
            object.__setattr__(self, "sampling_defaults",
                               {"values": read_values(d["values"]), "source": d["source"]})
        if self.add_bos_token and self.bos_token_id is None:
            raise ArtifactError("model.add_bos_token is true but model.bos_token_id is null",
                                path=MANIFEST_NAME)

    def _valid_token(self, t: Any) -> bool:
        return _is_int(t) and 0 <= t < self.vocab_size

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> ModelInfo:
        if not isinstance(manifest, dict):
            raise ArtifactError("the manifest is not a JSON object", path=MANIFEST_NAME)
        model = _require(manifest, "model", dict, "")
        eos = _require(model, "eos_token_ids", list, "model.")
        template = model.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise ArtifactError("model.chat_template must be a string or null", path=MANIFEST_NAME)
        return cls(
            model_id=_require(manifest, "model_id", str, ""),
            quantization=_require(manifest, "quantization", str, ""),
            family=_require(model, "family", str, "model."),
            vocab_size=_require(model, "vocab_size", int, "model."),
            context_window=_require(model, "context_window", int, "model."),
            page_size=_require(model, "page_size", int, "model."),
            prefill_chunk_size=_require(model, "prefill_chunk_size", int, "model."),
            max_batch_size=_require(model, "max_batch_size", int, "model."),
            bos_token_id=model.get("bos_token_id"),
            eos_token_ids=tuple(eos),
            add_bos_token=_require(model, "add_bos_token", bool, "model."),
            chat_template=template,
            kv_window=model.get("kv_window"),
            kv_window_pool=model.get("kv_window_pool"),
            task=model.get("task", "generate"),
            embedding=model.get("embedding"),
            sampling_defaults=model.get("sampling_defaults"),
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _require(section: dict[str, Any], key: str, kind: type, prefix: str) -> Any:
    if key not in section:
        raise ArtifactError(f"missing key '{prefix}{key}'", path=MANIFEST_NAME,
                            code="artifact_missing_key")
    value = section[key]
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise ArtifactError(f"'{prefix}{key}' must be {kind.__name__}, got {value!r}",
                            path=MANIFEST_NAME)
    return value
