"""The native grammar backend: xgrammar 0.1.27's C++ bindings (``engine.grammar``'s interface).

The PyPI package's ``__init__`` imports torch and transformers (for helpers wick does not use),
so this loads its compiled extension module directly: a user install needs neither (setup.sh
installs xgrammar with ``--no-deps``). The bitmask is a numpy int32 row, xgrammar's layout.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..engine.grammar import (
    JSON_ANY_WHITESPACE,
    JSON_INDENT,
    GrammarCache,
    GrammarSpec,
    VocabInfo,
    compile_error,
    json_schema_of,
    patch_json_ebnf,
)
from ..engine.grammar_limits import GrammarLimits
from ..engine.tools import structural_tag, tool_parameter_schemas
from .grammar_pool import GrammarPool, WorkerVocab

XGRAMMAR_VERSION = "0.1.27"
# threads of one compile in this process: it shares the machine with the engine's steps
COMPILE_THREADS = 1


def xgrammar_bindings():
    """xgrammar's ``xgrammar_bindings`` extension module, without running the package's
    ``__init__`` (which needs torch)."""
    name = "xgrammar.xgrammar_bindings"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("xgrammar")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"xgrammar=={XGRAMMAR_VERSION} is not installed "
                          f"(pip install --no-deps xgrammar=={XGRAMMAR_VERSION})")
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"xgrammar_bindings{suffix}"
            if path.exists():
                ext = importlib.util.spec_from_file_location("xgrammar_bindings", path)
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                sys.modules[name] = module
                return module
    raise ImportError("xgrammar's compiled bindings were not found")


class XGrammarMatcher:
    def __init__(self, core, compiled, words: int) -> None:
        self._m = core.GrammarMatcher(compiled, None, False, -1)
        self._mask = np.zeros((1, words), dtype=np.int32)

    def next_token_bitmask(self) -> bytes:
        self._m.fill_next_token_bitmask(self._mask, 0, False)
        return self._mask.tobytes()

    def accept(self, token: int) -> bool:
        return bool(self._m.accept_token(int(token), False))

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepts (speculation: drafts' masks were read)."""
        self._m.rollback(int(num_tokens))


class XGrammarCompiled:
    def __init__(self, core, compiled, words: int) -> None:
        self._core, self._compiled, self._words = core, compiled, words

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._core, self._compiled, self._words)


def compile_spec(core, compiler, spec: GrammarSpec):
    """xgrammar's compiled grammar for ``spec`` (the one recipe of the server process and of
    its compile children, ``grammar_worker``); raises ``compile_error`` for a spec xgrammar
    refuses."""
    try:
        if spec.kind == "ebnf":
            return compiler.compile_grammar(spec.source, "root")
        if spec.kind == "tool_calls":
            arguments = [schema_ebnf(core, s, True) for s in tool_parameter_schemas(spec.source)]
            return compiler.compile_grammar(core.Grammar.from_structural_tag(
                structural_tag(spec.source, arguments)))
        return compiler.compile_grammar(schema_ebnf(core, *json_schema_of(spec)), "root")
    except (RuntimeError, ValueError, TypeError) as e:
        raise compile_error(spec, str(e)) from None


def schema_ebnf(core, schema: str, strict: bool) -> str:
    """The (patched) EBNF of a JSON schema given as text."""
    grammar = core.Grammar.from_json_schema(schema, JSON_ANY_WHITESPACE, JSON_INDENT, None,
                                            strict, None, False)
    return patch_json_ebnf(grammar.to_string())


class XGrammarBackend:
    """``engine.grammar.GrammarBackend`` for one model's vocabulary.

    A grammar this process has not compiled yet is first compiled in a child process
    (``GrammarPool``), within ``limits.compile_timeout_s`` and a memory bound: a grammar that
    crashes xgrammar, or takes too long, costs that child, and its request gets a 400. What
    the child compiled is then compiled here, on a thread of this backend's own (never the
    threads that prepare requests), and kept in a cache bounded by the memory the child
    measured. xgrammar's own cache is off: it has no bound but its memory."""

    def __init__(self, vocab: VocabInfo, vocab_size: int, stop_token_ids: list[int],
                 limits: GrammarLimits = GrammarLimits()) -> None:
        self._core = core = xgrammar_bindings()
        self.vocab = vocab
        self.vocab_size = vocab_size
        self.limits = limits
        tokens = vocab.for_grammar()[:vocab_size]
        info = core.TokenizerInfo(tokens, vocab.vocab_type, vocab_size, list(stop_token_ids),
                                  vocab.add_prefix_space)
        self._compiler = core.GrammarCompiler(info, COMPILE_THREADS, False, -1)
        self._words = (vocab_size + 31) // 32
        self._cache = GrammarCache(capacity=4096, max_bytes=limits.cache_bytes)
        self._cache_lock = threading.Lock()
        self.pool = GrammarPool(WorkerVocab(tokens, vocab.vocab_type, vocab_size,
                                            list(stop_token_ids), vocab.add_prefix_space),
                                limits)
        self._threads = ThreadPoolExecutor(limits.workers, thread_name_prefix="wick-grammar")

    @property
    def cache(self) -> GrammarCache:
        return self._cache

    def _cached(self, spec: GrammarSpec) -> XGrammarCompiled | None:
        with self._cache_lock:
            return self._cache.get(spec)

    def _compile_here(self, spec: GrammarSpec, size: int) -> XGrammarCompiled:
        compiled = XGrammarCompiled(self._core, compile_spec(self._core, self._compiler, spec),
                                    self._words)
        with self._cache_lock:
            return self._cache.put(spec, compiled, size)

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        """Compile (or fetch from the cache), blocking."""
        hit = self._cached(spec)
        if hit is not None:
            return hit
        report = self.pool.run(spec)
        return self._compile_here(spec, report.bytes)

    async def compile_async(self, spec: GrammarSpec) -> XGrammarCompiled:
        """Compile (or fetch from the cache) without blocking the event loop; a caller that is
        cancelled (its client left) abandons the child's compile when nobody else waits."""
        hit = self._cached(spec)
        if hit is not None:
            return hit
        report = await self.pool.run_async(spec)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._compile_here, spec, report.bytes)

    def json_ebnf(self, spec: GrammarSpec) -> str:
        """The (patched) EBNF of a "json" or "json_schema" spec."""
        return schema_ebnf(self._core, *json_schema_of(spec))

    def close(self) -> None:
        """Stop the compile children (also done when this process exits)."""
        self.pool.close()
        self._threads.shutdown(wait=False, cancel_futures=True)


def grammar_for(tokenizer_json: str, vocab_size: int, stop_token_ids,
                limits: GrammarLimits = GrammarLimits()
                ) -> tuple[XGrammarBackend | None, VocabInfo]:
    """The model's vocabulary and its grammar backend (None, and a log line, when xgrammar is
    not installed: requests asking for structured output are then refused with a 400)."""
    vocab = VocabInfo.from_tokenizer_json(tokenizer_json, vocab_size)
    try:
        return XGrammarBackend(vocab, vocab_size, list(stop_token_ids), limits), vocab
    except ImportError as e:
        import logging

        logging.getLogger("wick").warning("structured output is off: %s", e)
        return None, vocab
