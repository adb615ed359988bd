"""The server-sent events decoder against the HTML specification.

The examples are the specification's own ("Interpreting an event stream"
and "Authoring notes", https://html.spec.whatwg.org/multipage/
server-sent-events.html), then its rules one by one: line endings, the byte
order mark, comments, fields without a colon, the one space removed,
``id`` and ``retry``, events without data, the unfinished last event.
Hypothesis then holds the decoder to a literal transcription of the
specification's algorithm over random streams, cut into random chunks.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch._wire._sse import EventTooLarge, ServerSentEvent, SSEDecoder


def decode(*chunks: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    return [event for chunk in chunks for event in decoder.feed(chunk)]


def decode_all(stream: bytes) -> tuple[list[ServerSentEvent], str, int | None]:
    decoder = SSEDecoder()
    events = decoder.feed(stream)
    return events, decoder.last_event_id, decoder.retry


# -- the specification's examples --------------------------------------------


def test_spec_example_stock_ticker_is_one_event_of_three_lines() -> None:
    stream = b"data: YHOO\ndata: +2\ndata: 10\n\n"
    assert decode(stream) == [ServerSentEvent("YHOO\n+2\n10")]


def test_spec_example_comment_ids_and_leading_space() -> None:
    stream = (
        b": test stream\n"
        b"\n"
        b"data: first event\n"
        b"id: 1\n"
        b"\n"
        b"data:second event\n"
        b"id\n"
        b"\n"
        b"data:  third event\n"
        b"\n"
    )
    assert decode(stream) == [
        ServerSentEvent("first event", id="1"),
        ServerSentEvent("second event", id=""),
        ServerSentEvent(" third event", id=""),
    ]


def test_spec_example_empty_data_and_the_discarded_last_block() -> None:
    stream = b"data\n\ndata\ndata\n\ndata:"
    assert decode(stream) == [ServerSentEvent(""), ServerSentEvent("\n")]


def test_spec_example_the_space_after_the_colon_is_optional() -> None:
    stream = b"data:test\n\ndata: test\n\n"
    assert decode(stream) == [ServerSentEvent("test"), ServerSentEvent("test")]


def test_spec_example_event_types() -> None:
    stream = (
        b"event: add\ndata: 73857293\n\n"
        b"event: remove\ndata: 2153\n\n"
        b"event: add\ndata: 113411\n\n"
    )
    assert decode(stream) == [
        ServerSentEvent("73857293", "add"),
        ServerSentEvent("2153", "remove"),
        ServerSentEvent("113411", "add"),
    ]


# -- line endings ------------------------------------------------------------


@pytest.mark.parametrize("newline", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_every_line_ending_gives_the_same_events(newline: bytes) -> None:
    lines = [b"event: a", b"data: 1", b"data: 2", b"", b": note", b"data: 3", b""]
    assert decode(newline.join(lines) + newline) == [
        ServerSentEvent("1\n2", "a"),
        ServerSentEvent("3"),
    ]


def test_mixed_line_endings_in_one_stream() -> None:
    assert decode(b"data: a\rdata: b\r\ndata: c\n\r\n") == [ServerSentEvent("a\nb\nc")]


def test_a_crlf_cut_between_chunks_is_one_line_ending() -> None:
    assert decode(b"data: a\r", b"\n", b"\r", b"\ndata: b\r\n\r\n") == [
        ServerSentEvent("a"),
        ServerSentEvent("b"),
    ]


def test_an_empty_chunk_between_cr_and_lf_changes_nothing() -> None:
    assert decode(b"data: a\r", b"", b"\n\r\n") == [ServerSentEvent("a")]


def test_two_crs_are_two_line_endings() -> None:
    assert decode(b"data: a\r\r") == [ServerSentEvent("a")]


def test_a_lone_cr_before_another_chunk_ends_its_line() -> None:
    assert decode(b"data: a\r", b"data: b\r", b"\r") == [ServerSentEvent("a\nb")]


# -- the byte order mark and UTF-8 -------------------------------------------


def test_a_byte_order_mark_at_the_start_is_stripped() -> None:
    assert decode(b"\xef\xbb\xbfdata: a\n\n") == [ServerSentEvent("a")]


def test_a_byte_order_mark_cut_across_chunks_is_stripped() -> None:
    assert decode(b"\xef", b"\xbb", b"\xbfdata: a\n\n") == [ServerSentEvent("a")]


def test_only_one_byte_order_mark_is_stripped() -> None:
    # The second one belongs to the field name, which is then unknown.
    assert decode(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n") == [
        ServerSentEvent("b")
    ]


def test_a_byte_order_mark_later_in_the_stream_is_data() -> None:
    assert decode(b"data: a\n\ndata: \xef\xbb\xbfb\n\n") == [
        ServerSentEvent("a"),
        ServerSentEvent("\ufeffb"),
    ]


def test_text_is_utf8_and_malformed_bytes_become_replacement_characters() -> None:
    assert decode(b"data: caf\xc3", b"\xa9 \xff\n\n") == [
        ServerSentEvent("café \ufffd")
    ]


# -- fields ------------------------------------------------------------------


def test_comments_and_unknown_fields_are_ignored() -> None:
    stream = b": hello\nfoo: bar\njustsometext\ndata: x\n:data: y\n\n"
    assert decode(stream) == [ServerSentEvent("x")]


def test_a_field_name_is_matched_exactly() -> None:
    stream = b"Data: a\ndata : b\ndata\x00: c\n data: d\ndata: e\n\n"
    assert decode(stream) == [ServerSentEvent("e")]


def test_only_one_leading_space_is_removed() -> None:
    assert decode(b"data:  two\ndata:\tsix\n\n") == [ServerSentEvent(" two\n\tsix")]


def test_a_colon_in_the_value_is_kept() -> None:
    assert decode(b'data: {"a": ":"}\n\n') == [ServerSentEvent('{"a": ":"}')]


def test_a_blank_line_without_data_dispatches_nothing_and_resets_the_type() -> None:
    events, _, _ = decode_all(b"event: x\n\ndata: a\n\nevent: y\nid: 7\n\ndata: b\n\n")
    assert events == [ServerSentEvent("a"), ServerSentEvent("b", id="7")]


def test_the_last_event_id_carries_over_and_an_id_with_null_is_ignored() -> None:
    events, last_id, _ = decode_all(
        b"id: 1\ndata: a\n\ndata: b\n\nid: 2\x003\ndata: c\n\n"
    )
    assert events == [
        ServerSentEvent("a", id="1"),
        ServerSentEvent("b", id="1"),
        ServerSentEvent("c", id="1"),
    ]
    assert last_id == "1"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"3000", 3000),
        (b"007", 7),
        (b"", None),
        (b" 12", None),  # two spaces: one is removed, one is not a digit
        (b"1_0", None),
        (b"+5", None),
        (b"-5", None),
        (b"1.5", None),
        (b"\xd9\xa1", None),  # ARABIC-INDIC DIGIT ONE: a digit, not ASCII
        (b"one thousand", None),
    ],
)
def test_retry_takes_ascii_digits_only(value: bytes, expected: int | None) -> None:
    events, _, retry = decode_all(b"retry: " + value + b"\n\n")
    assert (events, retry) == ([], expected)


def test_retry_keeps_its_last_valid_value() -> None:
    _, _, retry = decode_all(b"retry: 10\nretry: x\nretry\n\n")
    assert retry == 10


# -- the end of the stream ---------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [b"data: last", b"data: last\n", b"data: last\r", b"data: last\r\n"],
)
def test_an_event_without_its_blank_line_is_discarded_at_the_end(tail: bytes) -> None:
    assert decode(b"data: first\n\n" + tail) == [ServerSentEvent("first")]


def test_a_long_line_across_many_chunks() -> None:
    text = "x" * 10_000
    chunks = [b"data: "] + [b"x"] * 10_000 + [b"\n\n"]
    assert decode(*chunks) == [ServerSentEvent(text)]


# -- the specification's algorithm, literally, against random streams --------


def reference(stream: bytes) -> tuple[list[ServerSentEvent], str, int | None]:
    """The specification's steps, transcribed on the whole decoded text."""
    text = stream.decode("utf-8", "replace")
    text = text.removeprefix("\ufeff")
    lines = re.split(r"\r\n|\r|\n", text)
    lines.pop()  # not ended by a line break: discarded at the end
    events: list[ServerSentEvent] = []
    data, event_type, last_id, retry = "", "", "", None
    for line in lines:
        if line == "":
            if data == "":
                event_type = ""
                continue
            data = data.removesuffix("\n")
            events.append(ServerSentEvent(data, event_type or "message", last_id))
            data, event_type = "", ""
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            field, value = line.split(":", 1)
            value = value.removeprefix(" ")
        else:
            field, value = line, ""
        if field == "event":
            event_type = value
        elif field == "data":
            data += value + "\n"
        elif field == "id":
            if "\0" not in value:
                last_id = value
        elif field == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)
    return events, last_id, retry


PIECES = [
    b"data",
    b"data:",
    b"data: ",
    b"event: ",
    b"event",
    b"id: ",
    b"id",
    b"retry: ",
    b"retry:",
    b":",
    b" ",
    b"x",
    b"7",
    b"\r",
    b"\n",
    b"\r\n",
    b"\0",
    b"\xef\xbb\xbf",
    b"\xef\xbb",
    b"\xc3\xa9",
    b"\xc3",
    b"\xff",
    b"\xd9\xa1",
]
soup = st.lists(st.sampled_from(PIECES), max_size=60).map(b"".join)
# Streams shaped like real ones: field lines and blank lines, each ended by
# any line break, after an optional byte order mark (or a piece of one).
names = st.sampled_from([b"data", b"event", b"id", b"retry", b"Data", b"x", b""])
values = st.lists(st.sampled_from(PIECES[10:13] + PIECES[16:]), max_size=4).map(
    b"".join
)
separators = st.sampled_from([b"", b":", b": ", b":  "])
field_lines = st.tuples(names, separators, values).map(b"".join)
lines = st.one_of(st.just(b""), st.just(b": note"), field_lines)
ended_lines = st.tuples(lines, st.sampled_from([b"\n", b"\r", b"\r\n"])).map(b"".join)
shaped = st.tuples(
    st.sampled_from([b"", b"\xef\xbb\xbf", b"\xef\xbb", b"\xef\xbb\xbf" * 2]),
    st.lists(ended_lines, max_size=20).map(b"".join),
    st.sampled_from([b"", b"data: unfinished", b"\r"]),
).map(b"".join)
streams = st.one_of(shaped, soup)


@settings(max_examples=300)
@given(stream=streams, data=st.data())
def test_any_stream_cut_anywhere_decodes_as_the_specification_says(
    stream: bytes, data: st.DataObject
) -> None:
    cuts = sorted(
        data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    )
    chunks = [
        stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)
    ]
    decoder = SSEDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert (events, decoder.last_event_id, decoder.retry) == reference(stream)


@given(stream=streams)
def test_every_byte_alone_decodes_as_the_whole_stream(stream: bytes) -> None:
    decoder = SSEDecoder()
    events = [e for i in range(len(stream)) for e in decoder.feed(stream[i : i + 1])]
    assert events == decode_all(stream)[0]


# -- the bound on one event ------------------------------------------------------


def test_an_unended_line_past_the_bound_raises() -> None:
    decoder = SSEDecoder(max_event_bytes=10)
    assert decoder.feed(b"data: 1234") == []  # 10 bytes: at the bound
    with pytest.raises(
        EventTooLarge, match=r"^a server-sent event grew past 10 bytes without ending$"
    ):
        decoder.feed(b"5")


def test_an_event_whose_data_lines_pass_the_bound_raises() -> None:
    decoder = SSEDecoder(max_event_bytes=10)
    # Each data line holds its value and the line feed that joins it.
    assert decoder.feed(b"data: 1234\ndata: 5678\n") == []
    with pytest.raises(EventTooLarge):
        decoder.feed(b"data: 9\n")


def test_a_dispatched_event_frees_its_bytes() -> None:
    # A line counts whole until it ends ("data: " too), then by its value.
    decoder = SSEDecoder(max_event_bytes=14)
    for n in range(100):
        assert decoder.feed(b"data: 12345678\n\n") == [ServerSentEvent("12345678")]
        assert decoder.feed(b": a comment is no part of the event\n") == []
        assert decoder.feed(f"data: {n:08d}".encode()) == []
        assert decoder.feed(b"\n\n") == [ServerSentEvent(f"{n:08d}")]


@settings(max_examples=200)
@given(
    lines=st.lists(
        st.binary(max_size=12).filter(lambda b: b"\n" not in b and b"\r" not in b),
        max_size=8,
    ),
    limit=st.integers(1, 40),
)
def test_the_bound_is_the_unended_line_and_the_event_data(
    lines: list[bytes], limit: int
) -> None:
    # One data line after another, never dispatched: it raises exactly
    # when what it holds (values and their line feeds) passes the bound.
    decoder = SSEDecoder(max_event_bytes=limit)
    held = 0
    for value in lines:
        line = b"data:" + value
        if held + len(line) > limit:
            with pytest.raises(EventTooLarge):
                decoder.feed(line)
            return
        assert decoder.feed(line) == []
        held += len(value.removeprefix(b" ")) + 1
        if held > limit:
            with pytest.raises(EventTooLarge):
                decoder.feed(b"\n")
            return
        assert decoder.feed(b"\n") == []
