"""The worker's grammar backend (``wick.engine.grammar``'s interface, asynchronous form) over
@mlc-ai/web-xgrammar, the wasm build of the xgrammar version the server uses.

Everything web-xgrammar does is behind promises, so this backend offers ``compile_async`` and
its matchers ``next_token_bitmask_async`` (the async facade awaits both). The JS side
(web/src/grammar.ts) is created on the first request that needs a grammar: a chat that never
asks for JSON never loads it.
"""

from __future__ import annotations

from typing import Any

from wick.engine.grammar import (
    JSON_ANY_WHITESPACE,
    JSON_INDENT,
    GrammarCache,
    GrammarSpec,
    VocabInfo,
    compile_error,
    json_schema_of,
    patch_json_ebnf,
)
from wick.engine.tools import structural_tag, tool_parameter_schemas

class WebGrammarBackend:
    def __init__(self, create_js: Any, vocab: VocabInfo, vocab_size: int,
                 stop_token_ids) -> None:
        """``create_js(encoded_vocab, vocab_type, add_prefix_space, vocab_size, stop_ids)``
        resolves to web/src/grammar.ts's object."""
        self._create_js = create_js
        self._vocab, self._vocab_size = vocab, vocab_size
        self._stops = list(stop_token_ids)
        self._js: Any = None
        self._cache = GrammarCache(on_evict=lambda compiled: compiled.dispose())

    async def _lib(self) -> Any:
        if self._js is None:
            from pyodide.ffi import to_js

            self._js = await self._create_js(
                to_js(self._vocab.for_grammar()[:self._vocab_size]), self._vocab.vocab_type,
                self._vocab.add_prefix_space, self._vocab_size, to_js(self._stops))
        return self._js

    async def compile_async(self, spec: GrammarSpec) -> WebCompiled:
        return self._cache.get(spec) or self._cache.put(spec, await self._compile(spec))

    async def _compile(self, spec: GrammarSpec) -> WebCompiled:
        js = await self._lib()
        try:
            if spec.kind == "ebnf":
                compiled = await js.compileEBNF(spec.source)
            elif spec.kind == "tool_calls":
                arguments = [await self._schema_ebnf(js, s, True)
                             for s in tool_parameter_schemas(spec.source)]
                compiled = await js.compileStructuralTag(structural_tag(spec.source, arguments))
            else:
                compiled = await js.compileEBNF(
                    await self._schema_ebnf(js, *json_schema_of(spec)))
        except ValueError as e:
            raise compile_error(spec, str(e)) from None
        except Exception as e:  # a JsException: the reason xgrammar printed
            raise compile_error(spec, _js_message(e)) from None
        return WebCompiled(js, compiled)


    @staticmethod
    async def _schema_ebnf(js: Any, schema: str, strict: bool) -> str:
        return patch_json_ebnf(await js.jsonSchemaEBNF(
            schema, JSON_ANY_WHITESPACE, -1 if JSON_INDENT is None else JSON_INDENT, strict))


def _js_message(e: Exception) -> str:
    text = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return text.removeprefix("Error: ")


class WebCompiled:
    def __init__(self, js: Any, compiled: Any) -> None:
        self._js, self._compiled = js, compiled

    def matcher(self) -> WebMatcher:
        return WebMatcher(self._js, self._compiled)

    def dispose(self) -> None:
        self._compiled.dispose()


class WebMatcher:
    """Created lazily: web-xgrammar makes matchers behind a promise, and the engine asks for
    one when the request is queued. The first mask is awaited before any token is accepted."""

    def __init__(self, js: Any, compiled: Any) -> None:
        self._js, self._compiled = js, compiled
        self._m: Any = None

    async def next_token_bitmask_async(self) -> bytes:
        if self._m is None:
            self._m = await self._js.matcher(self._compiled)
        words = await self._m.getNextTokenBitmask()
        return words.to_bytes()

    def accept(self, token: int) -> bool:
        return bool(self._m.acceptToken(int(token)))

    def is_terminated(self) -> bool:
        return bool(self._m.isTerminated())

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepts (speculation: drafts' masks were read)."""
        self._m.rollback(int(num_tokens))

    def close(self) -> None:
        if self._m is not None:
            self._m.dispose()
            self._m = None
