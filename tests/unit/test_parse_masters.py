"""parse_masters: the --masters / AGORA_MASTERS comma list into normalised endpoints."""

from __future__ import annotations

import pytest
from agora.sdk.discovery import parse_masters


def test_bare_and_tcp_items_are_normalised_deduplicated_and_kept_in_order() -> None:
    text = " m2:5050,tcp://m1:5050 , m2:5050,tcp://[::1]:5051,ipc:///run/agora.sock"
    assert parse_masters(text) == (
        "tcp://m2:5050",
        "tcp://m1:5050",
        "tcp://[::1]:5051",
        "ipc:///run/agora.sock",
    )
    assert parse_masters("127.0.0.11:5050") == ("tcp://127.0.0.11:5050",)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("m1:5050,,m3:5050", "master endpoint 2 is empty"),
        ("m1:5050,", "master endpoint 2 is empty"),
        ("m1:5050,m2:http", "'m2:http'"),
        ("m1:5050,tcp://m2", "'tcp://m2'"),
        ("m1:70000", "'m1:70000'"),
        ("m1:0", "'m1:0'"),
        (":5050", "':5050'"),
        ("udp://m1:5050", "'udp://m1:5050'"),
    ],
)
def test_a_bad_item_is_named_in_the_error(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("[", r"\[")):
        parse_masters(text)


def test_nothing_at_all_is_an_error() -> None:
    with pytest.raises(ValueError, match="no master endpoints"):
        parse_masters("  ")
