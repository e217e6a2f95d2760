"""Splitting ``mpirun --tag-output`` output into per-rank lines, however the bytes are chunked."""

from __future__ import annotations

import itertools

from agora.frameworks.mpi.tags import Line, TagSplitter

# Shaped like what Open MPI 4.1.4 wrote here (chunks glued, a partial line finished later,
# a multi-line chunk, stderr, a UTF-8 character) with mpirun's own text before and after.
SAMPLE = (
    b"mpirun: starting\n"
    b"[1,0]<stdout>:p0[1,1]<stdout>:p1[1,0]<stdout>:q\n"
    b"[1,0]<stdout>:r[1,1]<stdout>:q\n[1,1]<stdout>:r[1,0]<stdout>:s\n"
    b"[12,2]<stderr>:warn: caf\xc3\xa9\nsecond\n"
    b"[1,1]<stdout>:s\n[1,3]<stddiag>:diag [x] <stdout>\n"
    b"[1,2]<stdout>:no newline"
)
EXPECTED: list[Line] = [
    (None, "stdout", "mpirun: starting"),
    (0, "stdout", "p0q"),
    (1, "stdout", "p1q"),
    (0, "stdout", "rs"),
    (2, "stderr", "warn: café"),
    (2, "stderr", "second"),
    (1, "stdout", "rs"),
    (3, "stderr", "diag [x] <stdout>"),
    (2, "stdout", "no newline"),
]


def split(chunks: list[bytes], *, per_line_tags: bool = False) -> list[Line]:
    splitter = TagSplitter(per_line_tags=per_line_tags)
    lines: list[Line] = []
    for chunk in chunks:
        lines.extend(splitter.feed(chunk))
    return lines + splitter.flush()


def test_sample_in_one_piece() -> None:
    assert split([SAMPLE]) == EXPECTED


def test_every_split_point_gives_the_same_lines() -> None:
    for cut in range(len(SAMPLE) + 1):
        assert split([SAMPLE[:cut], SAMPLE[cut:]]) == EXPECTED, cut


def test_every_pair_of_split_points_gives_the_same_lines() -> None:
    for a, b in itertools.combinations(range(len(SAMPLE) + 1), 2):
        assert split([SAMPLE[:a], SAMPLE[a:b], SAMPLE[b:]]) == EXPECTED, (a, b)


def test_byte_by_byte() -> None:
    assert split([SAMPLE[i : i + 1] for i in range(len(SAMPLE))]) == EXPECTED


def test_glued_chunks_of_different_ranks() -> None:
    splitter = TagSplitter()
    assert splitter.feed(b"[1,1]<stdout>:part[1,2]<stdout>:x\n") == [(2, "stdout", "x")]
    assert splitter.feed(b"[1,1]<stdout>:ial\n") == [(1, "stdout", "partial")]
    assert splitter.flush() == []


def test_lines_come_out_as_soon_as_complete() -> None:
    splitter = TagSplitter()
    assert splitter.feed(b"[1,0]<stdout>:a\nb") == [(0, "stdout", "a")]
    assert splitter.feed(b"c\n[1,0") == [(0, "stdout", "bc")]
    assert splitter.feed(b"]<stderr>:e\n") == [(0, "stderr", "e")]


def test_stdout_and_stderr_of_one_rank_keep_separate_partial_lines() -> None:
    stream = b"[1,0]<stdout>:o[1,0]<stderr>:e[1,0]<stdout>:ut\n[1,0]<stderr>:rr\n"
    assert split([stream]) == [(0, "stdout", "out"), (0, "stderr", "err")]


def test_things_that_look_like_tags_but_are_not_stay_text() -> None:
    stream = b"[1,0]<stdout>:[1,x]<stdout>: [1,0]<stdin>: [1] [12345678901,0]<stdout>:\n"
    expected: list[Line] = [(0, "stdout", stream[14:-1].decode())]
    assert split([stream]) == expected
    for cut in range(len(stream) + 1):
        assert split([stream[:cut], stream[cut:]]) == expected, cut


def test_a_cut_off_tag_at_the_end_is_text() -> None:
    assert split([b"[1,0]<stdout>:a\n[1,0]<std"]) == [
        (0, "stdout", "a"),
        (0, "stdout", "[1,0]<std"),
    ]


def test_invalid_utf8_is_replaced() -> None:
    assert split([b"[1,0]<stdout>:\xff\xfe ok\n"]) == [(0, "stdout", "\ufffd\ufffd ok")]


def test_by_default_untagged_lines_stay_with_the_last_tag() -> None:
    stream = b"[1,1]<stderr>:err\nmpirun noticed that rank 1 exited\n"
    assert split([stream]) == [
        (1, "stderr", "err"),
        (1, "stderr", "mpirun noticed that rank 1 exited"),
    ]


def test_per_line_tags_gives_untagged_lines_to_mpirun() -> None:
    stream = (
        b"[1,1]<stderr>:err\n-----\nmpirun noticed that rank 1 exited\n"
        b"[1,0]<stdout>:a[1,1]<stdout>:b[1,0]<stdout>:c\n"
    )
    expected: list[Line] = [
        (1, "stderr", "err"),
        (None, "stdout", "-----"),
        (None, "stdout", "mpirun noticed that rank 1 exited"),
        (0, "stdout", "ac"),
        (1, "stdout", "b"),
    ]
    for cut in range(len(stream) + 1):
        assert split([stream[:cut], stream[cut:]], per_line_tags=True) == expected, cut


def test_flush_empties_the_splitter() -> None:
    splitter = TagSplitter()
    assert splitter.feed(b"[1,0]<stdout>:half") == []
    assert splitter.flush() == [(0, "stdout", "half")]
    assert splitter.flush() == []
    assert splitter.feed(b"more\n") == [(0, "stdout", "more")]
