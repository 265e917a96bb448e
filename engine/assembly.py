"""The one recipe for an engine: an artifact on a backend becomes an ``EngineCore``.

Both hosts use it: the native engine (``wick.server.local``: wgpu, the HF tokenizers, xgrammar)
and the browser worker (``wick_web.host``: WebGPU, tokenizers and xgrammar compiled to wasm).
They differ only in the pieces handed in, so KV sizing, the runner and the core are built the
same way everywhere.
"""

from __future__ import annotations

from typing import Any, Callable

from .artifact import Artifact
from .core import EngineCore
from .draft_model import DraftModel
from .grammar import VocabInfo
from .grammar_limits import GrammarLimits
from .model_info import ModelInfo
from .runner import DEFAULT_KV_BUDGET, Runner, kv_pages_for
from .tokenizer import Tokenizer

# (tokenizer_json, model info) -> (grammar backend or None, the vocabulary it masks)
GrammarFactory = Callable[[str, ModelInfo], "tuple[Any, VocabInfo]"]


def no_grammar(tokenizer_json: str, info: ModelInfo) -> tuple[None, VocabInfo]:
    """No structured output (requests asking for it get a 400); the vocabulary still serves
    the tool-call parser and logit_bias checks."""
    return None, VocabInfo.from_tokenizer_json(tokenizer_json, info.vocab_size)


def assemble_core(art: Artifact, backend: Any, *,
                  tokenizer: Callable[[str], Tokenizer],
                  grammar: GrammarFactory = no_grammar,
                  kv_cache_bytes: int | None = None,
                  runner_class: type[Runner] = Runner,
                  batch_invariant: bool = True,
                  prefix_cache: bool = True,
                  grammar_limits: GrammarLimits = GrammarLimits(),
                  speculative: Any = None,
                  draft_artifact: Artifact | None = None,
                  draft_backend: Any = None,
                  **runner_options: Any) -> EngineCore:
    """The engine core for ``art`` on ``backend``. ``tokenizer(tokenizer_json)`` builds the
    host's tokenizer; ``grammar`` its structured-output backend (which ``grammar_limits`` bound);
    ``speculative`` the engine-level speculation (engine/speculative.py), whose method ``draft``
    runs ``draft_artifact`` with a KV pool of its own, on ``draft_backend`` (default: the same
    backend; the browser's WebAssembly executor holds one kernel module, so a draft there has an
    executor of its own); ``runner_options`` go to the runner (``progress``,
    ``upload_weights``)."""
    pages = kv_pages_for(art.manifest, kv_cache_bytes or DEFAULT_KV_BUDGET,
                         backend.max_storage_binding)
    runner = runner_class(art, backend, num_pages=pages, **runner_options)
    tokenizer_json = art.tokenizer_json()
    info = ModelInfo.from_manifest(art.manifest)
    grammar_backend, vocab = grammar(tokenizer_json, info)
    draft = None
    if draft_artifact is not None:
        draft_backend = draft_backend or backend
        draft_pages = kv_pages_for(draft_artifact.manifest, kv_cache_bytes or DEFAULT_KV_BUDGET,
                                   draft_backend.max_storage_binding)
        options = {k: v for k, v in runner_options.items() if k != "progress"}
        draft = DraftModel(runner_class(draft_artifact, draft_backend, num_pages=draft_pages,
                                        **options),
                           ModelInfo.from_manifest(draft_artifact.manifest), draft_pages,
                           draft_artifact.location)
    return EngineCore(runner, tokenizer(tokenizer_json), info, num_pages=pages,
                      batch_invariant=batch_invariant, prefix_cache=prefix_cache,
                      grammar=grammar_backend, vocab=vocab, grammar_limits=grammar_limits,
                      speculative=speculative, draft=draft)
