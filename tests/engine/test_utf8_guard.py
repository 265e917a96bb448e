"""The strict UTF-8 guard of grammar masks (engine/utf8_guard.py) against Python's own
incremental UTF-8 decoder, which refuses a byte as soon as no valid text can continue."""

from __future__ import annotations

import codecs
import itertools
import random

from wick.engine.utf8_guard import CLOSED, Utf8Guard, Utf8Table, advance


# the continuation bytes at the ends of every range RFC 3629 puts on a second byte
ENDS = (0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF)


def completes(pending: bytes) -> bool:
    """Whether some continuation bytes make ``pending`` one character, by CPython."""
    for n in (1, 2, 3):
        for tail in itertools.product(ENDS, repeat=n):
            try:
                (pending + bytes(tail)).decode("utf-8")
                return True
            except UnicodeDecodeError:
                pass
    return False


def python_accepts(data: bytes) -> tuple[bool, bool]:
    """(valid text can still follow, and no character is left open) by CPython's decoder
    (whose incremental form waits for a surrogate's last byte to refuse it: ED A0)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return False, False
    pending = decoder.getstate()[0]
    return (True, True) if not pending else (completes(pending), False)


def test_every_two_byte_start_and_random_strings_agree_with_python():
    interesting = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                   0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    cases = [bytes(p) for n in (1, 2, 3) for p in itertools.product(interesting, repeat=n)]
    rng = random.Random(3)
    cases += [bytes(rng.choice(interesting) for _ in range(rng.randint(1, 9)))
              for _ in range(20000)]
    cases += [chr(c).encode() for c in (0x41, 0x7FF, 0x800, 0xFFFD, 0x10000, 0x10FFFF)]
    for data in cases:
        state = advance(CLOSED, data)
        ok, closed = python_accepts(data)
        assert (state is not None) == ok, data
        if ok:
            assert (state == CLOSED) == closed, data


class ByteMatcher:
    """A stand-in grammar that allows every token always."""

    def __init__(self, size: int) -> None:
        self.words = (size + 31) // 32
        self.accepted: list[int] = []

    def next_token_bitmask(self) -> bytes:
        return b"\xff" * (4 * self.words)

    def accept(self, token: int) -> bool:
        self.accepted.append(token)
        return True

    def is_terminated(self) -> bool:
        return False


def allowed(mask: bytes, size: int) -> set[int]:
    value = int.from_bytes(mask, "little")
    return {i for i in range(size) if value >> i & 1}


def test_masks_allow_exactly_the_tokens_that_keep_the_text_decodable():
    # 256 single bytes, some multi-byte tokens (whole and partial characters), a special token
    tokens = [bytes([b]) for b in range(256)] + ["é".encode(), "€".encode(), "😀".encode(),
                                                  "😀".encode()[:2], b"\xa9x", b"ab", b""]
    table = Utf8Table(tokens)
    rng = random.Random(7)
    for _ in range(200):
        guard = Utf8Guard(ByteMatcher(len(tokens)), table)
        text = b""
        for _ in range(6):
            ok = allowed(guard.next_token_bitmask(), len(tokens))
            want = {i for i, t in enumerate(tokens) if not t or python_accepts(text + t)[0]}
            assert ok == want, text
            token = rng.choice(sorted(ok))
            assert guard.accept(token)
            text += tokens[token]
    assert not hasattr(Utf8Guard(ByteMatcher(4), table), "next_token_bitmask_async")


def test_a_grammar_that_allows_no_valid_continuation_keeps_its_own_mask():
    """xgrammar spells [à-ÿ] as single bytes: after 0xE9 it allows no continuation byte. The
    guard then leaves the grammar's mask whole instead of allowing nothing."""
    tokens = [bytes([b]) for b in range(256)]
    table = Utf8Table(tokens)
    state = table.token_state(CLOSED, 0xE9)
    only_ascii = sum(1 << t for t in range(0x61, 0x7B)).to_bytes(32, "little")
    assert table.narrow(state, only_ascii) == only_ascii


def test_close_reaches_the_wrapped_matcher():
    closed = []

    class Closing(ByteMatcher):
        def close(self) -> None:
            closed.append(True)

    Utf8Guard(Closing(4), Utf8Table([b"a", b"b", b"c", b""])).close()
    Utf8Guard(ByteMatcher(4), Utf8Table([b"a", b"b", b"c", b""])).close()  # none to call
    assert closed == [True]

