"""The native grammar backend: xgrammar 0.1.27's C++ bindings (``engine.grammar``'s interface).

The PyPI package's ``__init__`` imports torch and transformers (for helpers wick does not use),
so this loads its compiled extension module directly: a user install needs neither (setup.sh
installs xgrammar with ``--no-deps``). The bitmask is a numpy int32 row, xgrammar's layout.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
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
from ..engine.tools import structural_tag, tool_parameter_schemas

XGRAMMAR_VERSION = "0.1.27"


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


class XGrammarCompiled:
    def __init__(self, core, compiled, words: int) -> None:
        self._core, self._compiled, self._words = core, compiled, words

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self._core, self._compiled, self._words)


class XGrammarBackend:
    """``engine.grammar.GrammarBackend`` for one model's vocabulary."""

    def __init__(self, vocab: VocabInfo, vocab_size: int, stop_token_ids: list[int]) -> None:
        self._core = core = xgrammar_bindings()
        self.vocab = vocab
        self.vocab_size = vocab_size
        info = core.TokenizerInfo(vocab.for_grammar()[:vocab_size], vocab.vocab_type, vocab_size,
                                  list(stop_token_ids), vocab.add_prefix_space)
        self._compiler = core.GrammarCompiler(info, 8, True, -1)
        self._words = (vocab_size + 31) // 32
        self._cache = GrammarCache()
        self._lock = threading.Lock()  # requests are prepared on worker threads

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        with self._lock:
            return self._cache.get(spec) or self._cache.put(spec, self._compile(spec))

    def _compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        try:
            if spec.kind == "ebnf":
                compiled = self._compiler.compile_grammar(spec.source, "root")
            elif spec.kind == "tool_calls":
                arguments = [self.schema_ebnf(s, True) for s in tool_parameter_schemas(spec.source)]
                grammar = self._core.Grammar.from_structural_tag(
                    structural_tag(spec.source, arguments))
                compiled = self._compiler.compile_grammar(grammar)
            else:
                compiled = self._compiler.compile_grammar(self.json_ebnf(spec), "root")
        except (RuntimeError, ValueError, TypeError) as e:
            raise compile_error(spec, str(e)) from None
        return XGrammarCompiled(self._core, compiled, self._words)

    def json_ebnf(self, spec: GrammarSpec) -> str:
        """The (patched) EBNF of a "json" or "json_schema" spec."""
        return self.schema_ebnf(*json_schema_of(spec))

    def schema_ebnf(self, schema: str, strict: bool) -> str:
        grammar = self._core.Grammar.from_json_schema(schema, JSON_ANY_WHITESPACE, JSON_INDENT,
                                                      None, strict, None, False)
        return patch_json_ebnf(grammar.to_string())


def grammar_for(tokenizer_json: str, vocab_size: int,
                stop_token_ids) -> tuple[XGrammarBackend | None, VocabInfo]:
    """The model's vocabulary and its grammar backend (None, and a log line, when xgrammar is
    not installed: requests asking for structured output are then refused with a 400)."""
    vocab = VocabInfo.from_tokenizer_json(tokenizer_json, vocab_size)
    try:
        return XGrammarBackend(vocab, vocab_size, list(stop_token_ids)), vocab
    except ImportError as e:
        import logging

        logging.getLogger("wick").warning("structured output is off: %s", e)
        return None, vocab
