"""The embeddings endpoint: OpenAI's ``embeddings.create`` request and response, and how a
request's inputs become the token ids the engine embeds.

``input`` is a string, a list of strings, a list of token ids or a list of such lists (as the
official client sends them). Each input gets the model's special tokens (BERT's ``[CLS]`` and
``[SEP]``, read from its tokenizer at compile time) and is truncated to the model's longest
input, as sentence-transformers truncates at ``max_seq_length``. ``encoding_format="base64"``
gives each vector as little-endian float32 bytes in base64 (what the client decodes).
"""

from __future__ import annotations

import base64
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

from .core import SequenceOutput
from .endpoint import Endpoint, Submitted
from .errors import EngineAbortedError, InvalidRequestError
from .model_info import ModelInfo
from .tokenizer import Tokenizer

MAX_INPUTS = 2048  # OpenAI's bound on the inputs of one request
ENCODING_FORMATS = ("float", "base64")
_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(slots=True)
class EmbeddingRequest:
    input: Any
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None

    @classmethod
    def from_dict(cls, body: Any) -> EmbeddingRequest:
        if not isinstance(body, dict):
            raise InvalidRequestError("The request body must be a JSON object.",
                                      code="invalid_type")
        unknown = [k for k in body if k not in _FIELDS]
        if unknown:
            raise InvalidRequestError(f"Unrecognized request argument supplied: {unknown[0]}",
                                      param=unknown[0], code="unknown_parameter")
        if "input" not in body:
            raise InvalidRequestError("Missing required parameter: 'input'.", param="input",
                                      code="missing_required_parameter")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ENCODING_FORMATS:
            raise InvalidRequestError(f"Invalid value for 'encoding_format': {fmt!r}; it must be "
                                      "'float' or 'base64'.", param="encoding_format",
                                      code="invalid_value")
        dims = body.get("dimensions")
        if dims is not None and (not _is_int(dims) or dims < 1):
            raise InvalidRequestError(f"Invalid value for 'dimensions': {dims!r}; it must be a "
                                      "positive integer.", param="dimensions",
                                      code="invalid_value")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise InvalidRequestError("'model' must be a string.", param="model",
                                      code="invalid_type")
        return cls(input=body["input"], model=model, encoding_format=fmt, dimensions=dims,
                   user=body.get("user"))


def input_ids(req: EmbeddingRequest, tokenizer: Tokenizer, info: ModelInfo,
              most: int) -> list[list[int]]:
    """Each input's token ids, special tokens added, at most ``most`` tokens (truncated as
    sentence-transformers truncates: the text's end goes, the special tokens stay)."""
    emb = info.embedding or {}
    dims = emb.get("dimensions")
    if req.dimensions is not None and req.dimensions != dims:
        raise InvalidRequestError(f"This model makes vectors of {dims} dimensions and cannot "
                                  f"shorten them; leave 'dimensions' unset (or {dims}).",
                                  param="dimensions", code="unsupported_value")
    value = req.input
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_int(v) for v in value):
        items = [value]  # one input given as token ids
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidRequestError("'input' must be a string, a list of strings, a list of "
                                  "token ids or a list of such lists.", param="input",
                                  code="invalid_type")
    if not items:
        raise InvalidRequestError("'input' is empty.", param="input", code="invalid_value")
    if len(items) > MAX_INPUTS:
        raise InvalidRequestError(f"'input' has {len(items)} items; at most {MAX_INPUTS} are "
                                  "allowed.", param="input", code="invalid_value")
    prefix, suffix = list(emb.get("prefix_ids", [])), list(emb.get("suffix_ids", []))
    room = max(1, most - len(prefix) - len(suffix))
    out = []
    for i, item in enumerate(items):
        where = "input" if len(items) == 1 else f"input[{i}]"
        if isinstance(item, str):
            if not item:
                raise InvalidRequestError(f"'{where}' is an empty string.", param="input",
                                          code="invalid_value")
            ids = tokenizer.encode(item)
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            bad = [t for t in item if not 0 <= t < info.vocab_size]
            if bad:
                raise InvalidRequestError(f"'{where}': token ids {bad[:5]} are outside the "
                                          f"vocabulary [0, {info.vocab_size}).", param="input",
                                          code="invalid_value")
            ids = list(item)
        else:
            raise InvalidRequestError(f"'{where}' must be a non-empty string or a non-empty "
                                      "list of token ids.", param="input", code="invalid_type")
        out.append(prefix + ids[:room] + suffix)
    return out


@dataclass(slots=True)
class Embedding:
    index: int
    embedding: list[float] | str  # the values, or their float32 bytes in base64
    object: str = "embedding"

    def to_dict(self) -> dict[str, Any]:
        return {"object": self.object, "index": self.index, "embedding": self.embedding}


@dataclass(slots=True)
class EmbeddingUsage:
    prompt_tokens: int
    total_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "total_tokens": self.total_tokens}


@dataclass(slots=True)
class CreateEmbeddingResponse:
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"

    def to_dict(self) -> dict[str, Any]:
        return {"object": self.object, "data": [d.to_dict() for d in self.data],
                "model": self.model, "usage": self.usage.to_dict()}


@dataclass(slots=True)
class EmbeddingJob:
    """A validated request: its inputs' token ids, in input order."""

    request: EmbeddingRequest
    ids: list[list[int]]
    stream = False  # (what the facades ask of any prepared request)
    grammar_spec = None


def encode_vector(values: Sequence[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return [float(v) for v in values]
    data = array("f", values)
    if sys.byteorder != "little":
        data.byteswap()
    return base64.b64encode(data.tobytes()).decode("ascii")


@dataclass(slots=True)
class _Embedded:
    """An embedding request's stream state: the vectors so far, by input."""

    job: EmbeddingJob
    data: dict[int, Embedding] = field(default_factory=dict)


class EmbeddingsEndpoint(Endpoint):
    """Each input is a request of its own in the core, so the steps batch a request's inputs
    with each other and with other work; its "stream" is one ``Embedding`` per input."""

    def prepare(self, kwargs: dict[str, Any]) -> EmbeddingJob:
        req = EmbeddingRequest.from_dict(kwargs)
        self.check_model(req.model)
        info = self.core.info
        if info.task != "embed":
            raise InvalidRequestError(f"{info.model_id} is not an embedding model: it makes "
                                      "text (use chat or completions)", param="model",
                                      code="model_not_embedding")
        most = min(info.embedding["max_input_tokens"], self.core.scheduler.prefill_chunk_size)
        return EmbeddingJob(req, input_ids(req, self.core.tokenizer, info, most))

    def submit(self, job: EmbeddingJob) -> Submitted:
        rids: list[str] = []
        try:
            for ids in job.ids:
                rids.append(self.core.add_embedding(ids))
        except BaseException:
            for rid in rids:
                self.core.abort(rid)
            raise
        return Submitted(rids, False, _Embedded(job))

    def waiting_on(self, sub: Submitted) -> str | None:
        done = len(sub.state.data)
        return sub.request_ids[done] if done < len(sub.request_ids) else None

    def on_output(self, sub: Submitted, out: SequenceOutput) -> list[Any]:
        if out.embedding is None:  # (aborted)
            raise EngineAbortedError(f"embedding request {out.request_id} was aborted")
        index = len(sub.state.data)  # (the facades hand over the output waited on)
        item = Embedding(index, encode_vector(out.embedding,
                                              sub.state.job.request.encoding_format))
        sub.state.data[index] = item
        return [item]

    def fold(self, sub: Submitted, chunks: list[Embedding]) -> CreateEmbeddingResponse:
        """``data[i]`` the vector of input ``i``; usage counts the tokens embedded (special
        tokens included)."""
        tokens = sum(len(ids) for ids in sub.state.job.ids)
        return CreateEmbeddingResponse(sorted(chunks, key=lambda e: e.index), self.model,
                                       EmbeddingUsage(tokens, tokens))
