"""``agora reserve`` / ``agora unreserve``: arguments are checked before anything reaches the
master, and each makes its operator call with the resources reserved to ROLE."""

from __future__ import annotations

import pytest
from agora.sdk.cli.main import main
from agora.sdk.resources import Resources
from unit.test_cli_operate import FakeClient, client, usage_error

__all__ = ["client"]  # the fixture, used by name


@pytest.mark.parametrize(
    ("command", "method"), [("reserve", "reserve_resources"), ("unreserve", "unreserve_resources")]
)
def test_each_command_makes_its_call(client: FakeClient, command: str, method: str) -> None:
    assert main([command, "e1-A1", "db", "cpus:2;mem:1024"]) == 0
    assert client.calls == [(method, ("e1-A1", Resources.parse("cpus(db):2;mem(db):1024")))]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["reserve", "e1-A1", "db", "cpus(x):1"], "without a role"),
        (["reserve", "e1-A1", "db", "cpus:lots"], "bad resources"),
        (["reserve", "e1-A1", "bad role!", "cpus:1"], "ROLE"),
        (["unreserve", "e1-A1", "db"], "RESOURCES"),
    ],
)
def test_bad_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    assert words in usage_error(capsys, *argv)


def test_role_star_and_a_blank_agent_are_refused_before_any_call(
    client: FakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reserve", "e1-A1", "*", "cpus:1"]) == 2
    assert main(["reserve", " ", "db", "cpus:1"]) == 2
    assert client.calls == []
    err = capsys.readouterr().err
    assert "cannot be '*'" in err and "AGENT_ID is empty" in err
