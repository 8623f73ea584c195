"""Tool output is cut at a documented size, keeping its head and tail, with a marker that says what was dropped."""

from __future__ import annotations

from activator._mcp._output import CappedStream


def test_output_within_the_limit_is_kept_whole() -> None:
    stream = CappedStream("stdout", limit=10)
    for piece in (b"abc", b"defg", b"hij"):
        stream.add(piece)
    assert stream.text() == "abcdefghij"
    assert stream.dropped == 0


def test_output_past_the_limit_keeps_head_and_tail_around_a_marker() -> None:
    stream = CappedStream("stdout", limit=10)
    for piece in (b"0123", b"456789abc", b"defghij"):
        stream.add(piece)
    text = stream.text()
    assert text.startswith("01234\n[... 10 bytes of stdout cut here: at most 10 bytes per stream")
    assert text.endswith(" ...]\nfghij")
    assert stream.total == 20


def test_a_character_split_by_the_cut_does_not_break_the_text() -> None:
    stream = CappedStream("stderr", limit=4)
    stream.add("ééééé".encode())  # 10 bytes: the head keeps 2 (one é), the tail keeps 2 (one é)
    assert stream.text().startswith("é\n[... 6 bytes of stderr cut here")
    assert stream.text().endswith("é")
