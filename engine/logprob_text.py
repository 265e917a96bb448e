"""Sampled tokens' logprobs as the OpenAI APIs show them: the chat shape
(``choices[i].logprobs.content``) and the completions API's legacy parallel lists."""

from __future__ import annotations

from .batch import SampledToken
from .protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob


class TokenTexts:
    """Each token's text and bytes, cached per engine (one core's tokenizer and vocab)."""

    def __init__(self, core) -> None:  # EngineCore
        self.core = core
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def of(self, token: int) -> tuple[str, list[int]]:
        """A token's text and bytes: special tokens as written (e.g. "<|im_end|>"); a token
        that is part of a UTF-8 character as "bytes:\\xe2\\x80" (OpenAI's spelling), so that
        distinct tokens never share a text."""
        hit = self._cache.get(token)
        if hit is None:
            vocab = self.core.vocab
            raw = vocab.token_bytes(token) if vocab is not None else b""
            if not raw:
                raw = self.core.tokenizer.decode([token], skip_special_tokens=False).encode()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token] = (text, list(raw))
        return hit

    def chat(self, entries: list[SampledToken]) -> ChoiceLogprobs:
        content = []
        for e in entries:
            text, raw = self.of(e.token)
            top = [TopLogprob(self.of(t)[0], lp, self.of(t)[1]) for t, lp in e.top]
            content.append(TokenLogprob(text, e.logprob, raw, top))
        return ChoiceLogprobs(content)

    def completion(self, entries: list[SampledToken], offset: int) -> CompletionLogprobs:
        """Legacy logprobs; ``offset``: where the first entry's text starts in the choice's
        returned text."""
        out = CompletionLogprobs()
        for e in entries:
            text = self.of(e.token)[0]
            out.tokens.append(text)
            out.token_logprobs.append(e.logprob)
            top: dict[str, float] = {}
            for t, lp in e.top:
                top.setdefault(self.of(t)[0], lp)
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def echo(self, prompt_ids: list[int], entries: list[SampledToken]) -> CompletionLogprobs:
        """An echoed prompt's tokens in the legacy shape: the first has no logprob (nothing
        comes before it), each other the model's logprob of it and its position's most
        likely."""
        out = CompletionLogprobs()
        first = self.of(prompt_ids[0])[0]
        out.tokens.append(first)
        out.token_logprobs.append(None)
        out.top_logprobs.append(None)
        out.text_offset.append(0)
        return out.extend(self.completion(entries, len(first)))
