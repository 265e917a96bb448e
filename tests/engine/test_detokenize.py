from __future__ import annotations

from engine_fakes import ByteTokenizer
from wick.engine import IncrementalDetokenizer, StopStringFilter


def test_multibyte_characters_are_held_until_complete():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, tok.encode("hi"))
    ids = list("a€é!".encode())  # 1 + 3 + 2 + 1 bytes
    deltas = [detok.push(t) for t in ids]
    assert deltas == ["a", "", "", "€", "", "é", "!"]
    assert all("\ufffd" not in d for d in deltas)
    assert detok.flush() == ""


def test_flush_drops_an_unfinished_character_but_releases_complete_text():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ord("x")) == "x"
    assert detok.push(0xE2) == ""
    assert detok.flush() == ""
    # an invalid byte followed by more text is not "unfinished": it stays visible
    detok = IncrementalDetokenizer(tok)
    assert detok.push(0xFF) == ""
    assert detok.push(ord("y")) == "\ufffdy"


def test_joined_deltas_equal_a_full_decode():
    tok = ByteTokenizer()
    text = "naïve café — 東京 ok"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, [256, 258])
    assert "".join(detok.push(t) for t in ids) + detok.flush() == text


def test_stop_string_split_across_pushes_is_never_emitted():
    f = StopStringFilter(["STOP"])
    out = [f.push(t) for t in ["ab", "cS", "T", "O", "P", "tail"]]
    assert out == ["ab", "c", "", "", "", ""]
    assert f.stopped
    assert f.flush() == ""


def test_false_start_of_a_stop_string_is_released():
    f = StopStringFilter(["STOP"])
    assert f.push("xST") == "x"
    assert f.push("Ox") == "STOx"
    assert not f.stopped
    assert f.push("ST") == ""
    assert f.flush() == "ST"  # the sequence ended another way: held text is real output


def test_earliest_of_several_stop_strings_wins():
    f = StopStringFilter(["world", "lo w"])
    assert f.push("hello world") == "hel"
    assert f.stopped


def test_longest_possible_prefix_is_held():
    f = StopStringFilter(["abcd", "bx"])
    # "abc" could start "abcd"; "c" alone could not start either.
    assert f.push("zzabc") == "zz"
    assert f.push("x") == "abcx"
    assert f.push("b") == ""
    assert f.push("x") == ""
    assert f.stopped


def test_no_stop_strings_passes_through():
    f = StopStringFilter([])
    assert f.push("anything") == "anything"
    assert f.flush() == ""
