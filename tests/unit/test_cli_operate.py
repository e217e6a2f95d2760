"""`agora weights/quota/drain/reactivate/gone/teardown` without a master: argument checking, the
--yes rule, and which operator call each command makes (through a recording fake client)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from agora.sdk.cli import operate
from agora.sdk.cli.common import CliError
from agora.sdk.cli.main import build_parser, main
from agora.sdk.messages import OperatorDone
from agora.sdk.resources import Resources

# An address nothing answers at: a command that reached for the master would fail (exit 1) there.
NOWHERE = "tcp://127.0.0.1:1"


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Parse ``argv``, expecting argparse to reject it (exit 2); its stderr."""
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


class FakeClient:
    """Records the operator calls made and answers each with OPERATOR_DONE."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., Awaitable[OperatorDone]]:
        async def call(*args: Any, **kwargs: Any) -> OperatorDone:
            self.calls.append((name, args))
            return OperatorDone(call=name.upper(), message=f"{name} done")

        return call


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClient]:
    fake = FakeClient()

    def call_master(master: str, timeout: float, call: Any, curve: Any = None) -> Any:
        return asyncio.run(call(fake))

    monkeypatch.setattr(operate, "call_master", call_master)
    yield fake


# ------------------------------------------------------------------ weights


@pytest.mark.parametrize(
    ("argv", "pairs"),
    [
        (["batch=3"], [("batch", 3.0)]),
        (["batch=0.5", "ml=2"], [("batch", 0.5), ("ml", 2.0)]),
        (["*=1e3"], [("*", 1000.0)]),
    ],
)
def test_weights_parses_role_weight_pairs(argv: list[str], pairs: list[Any]) -> None:
    assert parse("weights", *argv).pairs == pairs


@pytest.mark.parametrize(
    ("pair", "why"),
    [
        ("batch", "expected ROLE=WEIGHT"),
        ("batch=", "expected a number"),
        ("batch=x", "expected a number"),
        ("=3", "invalid role name"),
        ("a b=3", "invalid role name"),
        ("batch=0", "must be a number from"),
        ("batch=-1", "must be a number from"),
        ("batch=inf", "must be a number from"),
        ("batch=nan", "must be a number from"),
        ("batch=2e6", "must be a number from"),
    ],
)
def test_a_bad_weights_pair_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], pair: str, why: str
) -> None:
    err = usage_error(capsys, "weights", "ok=1", pair)
    assert why in err and repr(pair) in err


def test_weights_needs_a_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert "ROLE=WEIGHT" in usage_error(capsys, "weights")


def test_a_role_named_twice_is_a_usage_error_before_any_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["weights", "--master", NOWHERE, "batch=1", "batch=2"]) == 2
    assert "role 'batch' is given twice" in capsys.readouterr().err


def test_weights_sends_the_mapping_and_prints_the_answer(
    client: FakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["weights", "batch=3", "ml=0.5"]) == 0
    assert client.calls == [("update_weights", ({"batch": 3.0, "ml": 0.5},))]
    assert capsys.readouterr().out == "update_weights done\n"


# ------------------------------------------------------------------ quota


def test_quota_guarantee_and_limit(client: FakeClient) -> None:
    assert main(["quota", "batch", "--guarantee", "cpus:1;mem:512", "--limit", "cpus:2"]) == 0
    assert client.calls == [
        ("update_quota", ("batch", Resources.parse("cpus:1;mem:512"), Resources.parse("cpus:2")))
    ]


def test_quota_guarantee_alone_has_no_limit(client: FakeClient) -> None:
    assert main(["quota", "batch", "--guarantee", "cpus:1"]) == 0
    assert client.calls == [("update_quota", ("batch", Resources.parse("cpus:1"), None))]


def test_quota_remove(client: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quota", "batch", "--remove"]) == 0
    assert client.calls == [("remove_quota", ("batch",))]
    assert capsys.readouterr().out == "remove_quota done\n"


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["batch"], "one of the arguments --guarantee --remove is required"),
        (["batch", "--guarantee", "cpus:1", "--remove"], "not allowed with"),
        (["batch", "--guarantee", "cpus:x"], "bad resources 'cpus:x'"),
        (["batch", "--guarantee", ""], "expected resources"),
        (["batch", "--guarantee", "ports:[1-9]"], "scalar resources only"),
        (["batch", "--guarantee", "cpus:1", "--limit", "cpus:-1"], "bad resources"),
        (["bad role", "--remove"], "invalid role name"),
    ],
)
def test_bad_quota_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], why: str
) -> None:
    assert why in usage_error(capsys, "quota", *argv)


def test_quota_remove_with_a_limit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["quota", "--master", NOWHERE, "batch", "--remove", "--limit", "cpus:1"]) == 2
    assert "--limit goes with --guarantee" in capsys.readouterr().err


# ------------------------------------------------------------------ agents and frameworks


@pytest.mark.parametrize(
    ("argv", "method"),
    [
        (["drain", "e1-A1"], "drain_agent"),
        (["reactivate", "e1-A1"], "reactivate_agent"),
        (["gone", "e1-A1", "--yes"], "mark_agent_gone"),
        (["teardown", "e1-F2", "--yes"], "teardown_framework"),
    ],
)
def test_each_command_makes_its_call_with_the_id_given(
    client: FakeClient, capsys: pytest.CaptureFixture[str], argv: list[str], method: str
) -> None:
    assert main(argv) == 0
    assert client.calls == [(method, (argv[1],))]
    assert capsys.readouterr().out == f"{method} done\n"


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["gone", "e1-A1"], "marking agent e1-A1 gone cannot be undone"),
        (["teardown", "e1-F2"], "tearing framework e1-F2 down cannot be undone"),
    ],
)
def test_irreversible_calls_without_yes_are_refused_before_any_call(
    client: FakeClient, capsys: pytest.CaptureFixture[str], argv: list[str], why: str
) -> None:
    assert main(argv) == 2
    assert client.calls == []
    err = capsys.readouterr().err
    assert why in err and "--yes" in err


def test_drain_and_reactivate_take_no_yes(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--yes" in usage_error(capsys, "drain", "e1-A1", "--yes")
    assert "AGENT_ID" in usage_error(capsys, "reactivate")


def test_a_blank_id_is_a_usage_error(
    client: FakeClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["drain", " "]) == 2
    assert client.calls == [] and "AGENT_ID is empty" in capsys.readouterr().err


def test_a_refusal_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What call_master raises for the master's ERROR reaches the user as one line."""

    def refuse(*_: Any, **__: Any) -> Any:
        raise CliError("the master refused: DRAIN_AGENT: no agent x in the cluster (UNKNOWN_AGENT)")

    monkeypatch.setattr(operate, "call_master", refuse)
    assert main(["drain", "x"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "agora drain: the master refused: DRAIN_AGENT: no agent x in the cluster (UNKNOWN_AGENT)\n"
    )
