"""agora run's output relay: numbered chunks are written once and in order; a lost chunk opens a
gap that the sandbox fills, after which relaying goes on."""

from __future__ import annotations

from agora.sdk.cli.run_output import OutputRelay


def test_chunks_in_order_are_written_as_they_come() -> None:
    relay = OutputRelay()
    assert relay.chunk("stdout", b"hello ", 0) == b"hello "
    assert relay.chunk("stderr", b"warn", 0) == b"warn"
    assert relay.chunk("stdout", b"world\n", 6) == b"world\n"
    assert relay.written == {"stdout": 12, "stderr": 4}
    assert not relay.incomplete


def test_a_chunk_seen_twice_is_written_once() -> None:
    relay = OutputRelay()
    relay.chunk("stdout", b"abc", 0)
    assert relay.chunk("stdout", b"abc", 0) == b""
    assert relay.chunk("stdout", b"bcde", 1) == b"de", "only the part not written yet"


def test_a_lost_chunk_opens_a_gap_and_holds_what_comes_after_it() -> None:
    relay = OutputRelay()
    relay.chunk("stdout", b"one\n", 0)
    assert relay.chunk("stdout", b"three\n", 8) == b"", "two\\n (4..8) never arrived"
    assert relay.gaps == {"stdout"} and relay.incomplete
    assert relay.chunk("stderr", b"e", 0) == b"e", "the other stream goes on"


def test_the_sandbox_fills_the_gap_and_relaying_goes_on() -> None:
    relay = OutputRelay()
    relay.chunk("stdout", b"one\n", 0)
    relay.chunk("stdout", b"three\n", 8)
    relay.gaps.discard("stdout")  # read_rest closes the gap it is about to fill
    assert relay.filled("stdout", b"two\nthree\n", 4, 14) == b"two\nthree\n"
    assert relay.written["stdout"] == 14
    assert relay.chunk("stdout", b"four\n", 14) == b"four\n"
    assert relay.chunk("stdout", b"three\n", 8) == b"", "a late duplicate is dropped"


def test_what_was_relayed_while_the_sandbox_was_read_is_not_written_twice() -> None:
    relay = OutputRelay()
    relay.chunk("stdout", b"ab", 0)
    relay.chunk("stdout", b"ef", 4)  # gap: cd
    relay.gaps.discard("stdout")
    assert relay.filled("stdout", b"cd", 2, 4) == b"cd"
    assert relay.chunk("stdout", b"efgh", 4) == b"efgh"
    assert relay.filled("stdout", b"efghij", 4, 10) == b"ij", "efgh came by the relay already"
    assert relay.filled("stdout", b"gh", 6, 8) == b""


def test_an_agent_that_does_not_number_its_chunks_is_relayed_as_it_comes() -> None:
    relay = OutputRelay()
    assert relay.chunk("stdout", b"old ", None) == b"old "
    assert relay.chunk("stdout", b"agent", None) == b"agent"
    assert relay.written["stdout"] == 9 and not relay.incomplete


def test_a_resubscription_alone_makes_the_output_incomplete() -> None:
    """A lost last chunk leaves no gap behind it: after a failover the end is read back."""
    relay = OutputRelay(resubscribed=True)
    assert relay.incomplete and not relay.gaps
