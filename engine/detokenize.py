"""Turning sampled tokens into text, one step at a time, without ever emitting a wrong byte.

Two filters, applied in order to each sequence's output:

1. ``IncrementalDetokenizer``: byte-level tokenizers split multi-byte UTF-8 characters across
   tokens, and SentencePiece decoders change a token's text depending on its neighbours. So we
   decode a small window (``prefix_offset:``) and emit only the text past what the window's
   prefix (``prefix_offset:read_offset``) already produced, and only once it does not end in
   U+FFFD (an incomplete character). The technique of HF text-generation-inference and vLLM.
2. ``StopStringFilter``: never emits any part of a stop string. Text that could be the start of a
   stop string is held back until it is either a full match (the sequence stops, the match and
   everything after it are dropped) or can no longer match (it is released).
"""

from __future__ import annotations

from collections.abc import Sequence

from .tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded as context for the first output tokens (a SentencePiece "▁word" decodes
# to " word" only after another token).
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Decodes one sequence's output tokens incrementally."""

    __slots__ = ("_tokenizer", "_ids", "_prefix_offset", "_read_offset", "_skip_special")

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)

    def push(self, token_id: int) -> str:
        """Add one output token; return the new text that is now certain (maybe "")."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end: whatever is still held back, except an unfinished character (cut off by
        max_tokens or a stop token): it is dropped rather than shown as U+FFFD."""
        return self._advance(final=True).rstrip(REPLACEMENT_CHAR)

    def _advance(self, final: bool) -> str:
        skip, decode = self._skip_special, self._tokenizer.decode
        window = self._ids[self._prefix_offset:]
        prefix_text = decode(window[:self._read_offset - self._prefix_offset],
                             skip_special_tokens=skip)
        new_text = decode(window, skip_special_tokens=skip)
        if len(new_text) <= len(prefix_text) or (new_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        delta = new_text[len(prefix_text):]
        # Slide the window: the tokens just read become the next prefix. The list is trimmed so
        # decoding stays O(window), not O(output length).
        del self._ids[:self._read_offset]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        return delta


class StopStringFilter:
    """Holds back text that might begin a stop string; reports when one is complete."""

    __slots__ = ("_stops", "_held", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Add newly decoded text; return the part that can be emitted now."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        # The earliest complete match wins; held text never contains a whole stop string.
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[:min(hits)]
        keep = self._longest_stop_prefix_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """At the end (not by a stop string): release what was held back."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:k]):
                    best = k
                    break
        return best
