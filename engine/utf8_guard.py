"""Strict UTF-8 under a grammar: constrained output is text, whatever bytes the tokens hold.

xgrammar 0.1.27 reads a multi-byte character leniently: after a lead byte it takes any
continuation bytes, so an overlong form (F0 86 AC AB), a surrogate (ED A0 80) or a code point
past U+10FFFF (F4 90 ..) passes a JSON string rule. A byte-level or byte-fallback vocabulary can
spell them a byte at a time, and the output then decodes to U+FFFD runs: invalid text inside
"valid" JSON, past a schema's maxLength. (Bytes that never occur in UTF-8 are already blanked
from the grammar's vocabulary: ``VocabInfo.for_grammar``.)

``Utf8Guard`` follows the bytes a sequence accepted with the strict decoder of RFC 3629
(Unicode's table 3-7) and narrows each grammar mask to the tokens that keep the output
decodable. Its state is the range the next byte must fall in and how many continuation bytes
remain; per state, the allowed tokens are computed once per vocabulary (only tokens holding a
non-ASCII byte need a look: an ASCII token is allowed exactly when no character is open).
Special tokens (no bytes) are never narrowed away: the grammar alone decides when to stop.
"""

from __future__ import annotations

from typing import Any

# (continuation bytes still to come, lowest and highest value the next byte may take)
State = tuple[int, int, int]
CLOSED: State = (0, 0, 0)  # between characters


def lead(byte: int) -> State | None:
    """The state after ``byte`` between characters (None: no character starts with it)."""
    if byte < 0x80:
        return CLOSED
    if 0xC2 <= byte <= 0xDF:
        return 1, 0x80, 0xBF
    if byte == 0xE0:
        return 2, 0xA0, 0xBF  # no overlong 3-byte forms
    if byte == 0xED:
        return 2, 0x80, 0x9F  # no surrogates
    if 0xE1 <= byte <= 0xEF:
        return 2, 0x80, 0xBF
    if byte == 0xF0:
        return 3, 0x90, 0xBF  # no overlong 4-byte forms
    if 0xF1 <= byte <= 0xF3:
        return 3, 0x80, 0xBF
    if byte == 0xF4:
        return 3, 0x80, 0x8F  # nothing past U+10FFFF
    return None


def never_in_utf8() -> frozenset[int]:
    """The bytes no UTF-8 text holds: neither a character's first byte nor a continuation
    (C0, C1, F5-FF)."""
    return frozenset(b for b in range(256) if lead(b) is None and not 0x80 <= b <= 0xBF)


def advance(state: State, data: bytes) -> State | None:
    """The state after ``data`` (None: the bytes are not UTF-8 from ``state``)."""
    remaining, low, high = state
    for byte in data:
        if remaining:
            if not low <= byte <= high:
                return None
            remaining, low, high = remaining - 1, 0x80, 0xBF
            if not remaining:
                low = high = 0
        else:
            nxt = lead(byte)
            if nxt is None:
                return None
            remaining, low, high = nxt
    return remaining, low, high


class Utf8Table:
    """One vocabulary's tokens by the strict-UTF-8 states they may follow."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self._bytes = token_bytes
        self._wide: list[int] = []  # tokens holding a non-ASCII byte
        ascii_bits = bytearray(len(token_bytes) // 8 + 1)
        special_bits = bytearray(len(token_bytes) // 8 + 1)
        for i, b in enumerate(token_bytes):
            if not b:
                special_bits[i >> 3] |= 1 << (i & 7)
            elif b.isascii():
                ascii_bits[i >> 3] |= 1 << (i & 7)
            else:
                self._wide.append(i)
        self._special = int.from_bytes(special_bits, "little")
        self._ascii = int.from_bytes(ascii_bits, "little")
        self._allowed: dict[State, int] = {}

    @classmethod
    def of(cls, vocab: Any) -> "Utf8Table":
        """From an ``engine.grammar.VocabInfo`` (special tokens give no bytes)."""
        return cls([b"" if i in vocab.special_ids else vocab.token_bytes(i)
                    for i in range(len(vocab.encoded))])

    def token_state(self, state: State, token: int) -> State | None:
        data = self._bytes[token] if 0 <= token < len(self._bytes) else b""
        return advance(state, data) if data else state

    def allowed(self, state: State) -> int:
        """The tokens that may follow ``state``, as an integer whose bit i is token i."""
        bits = self._allowed.get(state)
        if bits is None:
            wide = bytearray(len(self._bytes) // 8 + 1)
            for i in self._wide:
                if advance(state, self._bytes[i]) is not None:
                    wide[i >> 3] |= 1 << (i & 7)
            bits = self._special | int.from_bytes(wide, "little")
            if state == CLOSED:
                bits |= self._ascii
            self._allowed[state] = bits
        return bits

    def narrow(self, state: State, mask: bytes) -> bytes:
        """A grammar's bitmask (little-endian int32 words, bit i % 32 of word i // 32 = token i)
        with the tokens that would break UTF-8 after ``state`` cleared."""
        if state == CLOSED and not self._wide:
            return mask
        narrowed = int.from_bytes(mask, "little") & self.allowed(state)
        if not narrowed:
            # xgrammar reads a non-ASCII character class as single bytes ([à-ÿ] allows 0xE9
            # alone, then no continuation): no token keeps the text valid. Sampling from an
            # empty mask would end the output broken, so the grammar's own mask stands.
            return mask
        return narrowed.to_bytes(len(mask), "little")


class Utf8Guard:
    """A grammar matcher whose masks keep the output strict UTF-8 (wraps either backend's
    matcher; the wasm one answers masks with a promise)."""

    def __init__(self, matcher: Any, table: Utf8Table) -> None:
        self._matcher, self._table = matcher, table
        self._state: State = CLOSED
        self._history: list[State] = []  # the state before each accepted token (rollback)
        if hasattr(matcher, "next_token_bitmask_async"):
            self.next_token_bitmask_async = self._bitmask_async
        else:
            self.next_token_bitmask = self._bitmask
        if hasattr(matcher, "rollback"):
            self.rollback = self._rollback

    def _bitmask(self) -> bytes:
        return self._table.narrow(self._state, self._matcher.next_token_bitmask())

    async def _bitmask_async(self) -> bytes:
        return self._table.narrow(self._state, await self._matcher.next_token_bitmask_async())

    def accept(self, token: int) -> bool:
        if not self._matcher.accept(token):
            return False
        # a token the mask let through keeps the text decodable; were it not (a caller that
        # skipped the mask), the next character starts afresh rather than the guard locking
        self._history.append(self._state)
        self._state = self._table.token_state(self._state, token) or CLOSED
        return True

    def _rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self._state = self._history[-num_tokens]
            del self._history[-num_tokens:]

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def close(self) -> None:
        """Free the wrapped matcher (the wasm one holds memory outside Python's reach)."""
        close = getattr(self._matcher, "close", None)
        if close is not None:
            close()
