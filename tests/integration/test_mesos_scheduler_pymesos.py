"""Unmodified Mesos schedulers on a real Agora cluster, over the Mesos v1 scheduler HTTP API.

A pymesos scheduler launches tasks, kills one, reconciles, fails over and re-subscribes with its
framework id; a pymesos executor it declares runs its tasks. A bare client checks the failure
paths a Mesos framework meets, answered as Mesos answers them."""

from __future__ import annotations

import getpass
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.cluster import LocalCluster
from support.mesos_stream import Subscription, basic, post, subscribe
from support.polling import wait_for

pymesos = pytest.importorskip(
    "pymesos", reason="pymesos is installed by `make test` (tests/support/install_pymesos.sh)"
)

ALICE = ("alice", "token-of-alice-0123456789")
BOB = ("bob", "token-of-bob-0123456789xx")
SMALL = [
    {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
    {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
]

# A pymesos executor: RUNNING on launch, FINISHED when told "finish" by a framework message.
PYMESOS_EXECUTOR = r"""
from pymesos import Executor, MesosExecutorDriver, encode_data, decode_data

class Echo(Executor):
    def launchTask(self, driver, task):
        self.task_id = task["task_id"]
        driver.sendStatusUpdate({"task_id": task["task_id"], "state": "TASK_RUNNING"})

    def frameworkMessage(self, driver, message):
        if decode_data(message) == b"finish":
            driver.sendStatusUpdate({"task_id": self.task_id, "state": "TASK_FINISHED",
                                     "data": encode_data(b"echoed")})
            driver.sendFrameworkMessage(encode_data(b"bye"))

MesosExecutorDriver(Echo()).run()
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    credentials = tmp_path / "http.toml"
    credentials.write_text(f'{ALICE[0]} = "{ALICE[1]}"\n{BOB[0]} = "{BOB[1]}"\n')
    args = ("--http-port", "0", "--http-credentials", str(credentials))
    with LocalCluster(tmp_path / "cluster", agents=1, master_args=args) as c:
        yield c


def _url(cluster: LocalCluster) -> str:
    return (cluster.work_dir / "master.endpoint.http").read_text().strip()


def _task(task_id: str, offer: dict[str, Any], **how: Any) -> dict[str, Any]:
    return {
        "task_id": {"value": task_id},
        "agent_id": offer["agent_id"],
        "name": task_id,
        "resources": SMALL,
        **(how or {"command": {"value": "sleep 300"}}),
    }


@dataclass
class PymesosScheduler(pymesos.Scheduler):  # type: ignore[misc]
    """Launches what it is given on the next offer; records what it hears."""

    todo: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    registrations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def registered(self, driver: Any, framework_id: Any, master_info: Any) -> None:
        self.registrations.append("registered:" + framework_id["value"])

    def reregistered(self, driver: Any, master_info: Any) -> None:
        self.registrations.append("reregistered")

    def resourceOffers(self, driver: Any, offers: list[dict[str, Any]]) -> None:
        with self.lock:
            todo, self.todo = self.todo, []
        if not todo:
            driver.declineOffer([o["id"] for o in offers], {"refuse_seconds": 0.5})
            return
        offer = offers[0]
        driver.launchTasks(offer["id"], [_task(t["id"], offer, **t["how"]) for t in todo])
        if offers[1:]:
            driver.declineOffer([o["id"] for o in offers[1:]])

    def statusUpdate(self, driver: Any, status: dict[str, Any]) -> None:
        self.statuses.append(status)

    def frameworkMessage(self, driver: Any, executor_id: Any, agent_id: Any, data: str) -> None:
        self.messages.append(pymesos.decode_data(data))

    def error(self, driver: Any, message: str) -> None:
        self.errors.append(message)

    def launch(self, task_id: str, **how: Any) -> None:
        with self.lock:
            self.todo.append({"id": task_id, "how": how})

    def state_of(self, task_id: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            for s in reversed(self.statuses):
                if s["task_id"]["value"] == task_id and s["state"] == state:
                    return s
            return None

        return wait_for(seen, timeout, f"{task_id} {state} (saw {self.statuses})")


def _driver(sched: PymesosScheduler, url: str, framework_id: str | None = None) -> Any:
    info: dict[str, Any] = {"user": getpass.getuser(), "name": "pymesos-on-agora"}
    if framework_id is not None:
        info["id"] = {"value": framework_id}
    driver = pymesos.MesosSchedulerDriver(
        sched, info, url.removeprefix("http://"), principal=ALICE[0], secret=ALICE[1]
    )
    driver.start()
    return driver


def test_a_pymesos_scheduler_launches_kills_reconciles_and_fails_over(
    cluster: LocalCluster,
) -> None:
    url = _url(cluster)
    first = PymesosScheduler()
    driver = _driver(first, url)
    try:
        wait_for(lambda: first.registrations, 20, "SUBSCRIBED")
        framework_id = first.registrations[0].removeprefix("registered:")
        executor = {
            "executor_id": {"value": "echo"},
            "command": {"value": f"exec {sys.executable} - <<'EOF'\n{PYMESOS_EXECUTOR}\nEOF\n"},
            "resources": [
                {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
                {"name": "mem", "type": "SCALAR", "scalar": {"value": 256}},
            ],
        }
        first.launch("keep")
        first.launch("doomed")
        first.launch("echo-task", executor=executor)
        first.state_of("keep", "TASK_RUNNING")
        first.state_of("doomed", "TASK_RUNNING")
        running = first.state_of("echo-task", "TASK_RUNNING", timeout=60)
        assert running["source"] == "SOURCE_EXECUTOR"

        driver.killTask({"value": "doomed"})
        first.state_of("doomed", "TASK_KILLED")

        driver.sendFrameworkMessage(
            {"value": "echo"}, running["agent_id"], pymesos.encode_data(b"finish")
        )
        finished = first.state_of("echo-task", "TASK_FINISHED")
        assert pymesos.decode_data(finished["data"]) == b"echoed"
        wait_for(lambda: b"bye" in first.messages, 20, "the executor's message")

        before = len(first.statuses)
        driver.reconcileTasks([])  # implicit: every task the master knows of, as it is now
        wait_for(
            lambda: any(
                s["task_id"]["value"] == "keep" and s.get("reason") == "REASON_RECONCILIATION"
                for s in first.statuses[before:]
            ),
            20,
            "the implicit reconciliation",
        )
    finally:
        driver.stop(failover=True)  # the scheduler goes away; its framework waits for it
        driver.join()

    second = PymesosScheduler()
    driver = _driver(second, url, framework_id)
    try:
        wait_for(lambda: second.registrations, 20, "re-SUBSCRIBED")
        assert second.registrations == ["reregistered"]
        driver.reconcileTasks([{"task_id": {"value": "keep"}}])
        update = second.state_of("keep", "TASK_RUNNING")
        assert update["reason"] == "REASON_RECONCILIATION"
        driver.killTask({"value": "keep"})
        second.state_of("keep", "TASK_KILLED")
        assert not first.errors and not second.errors
    finally:
        driver.stop()  # not a failover: TEARDOWN
        driver.join()
    wait_for(
        lambda: (
            not any(f.framework_id == framework_id and f.active for f in cluster.state().frameworks)
        ),
        20,
        "the teardown",
    )


def _offer(sub: Subscription) -> dict[str, Any]:
    return dict(sub.wait(lambda e: e["type"] == "OFFERS")["offers"]["offers"][0])


def _update_of(sub: Subscription, task_id: str) -> dict[str, Any]:
    event = sub.wait(
        lambda e: e["type"] == "UPDATE" and e["update"]["status"]["task_id"]["value"] == task_id
    )
    return dict(event["update"]["status"])


def test_failure_paths_are_answered_as_mesos_answers_them(cluster: LocalCluster) -> None:
    url = _url(cluster)
    info = {"user": getpass.getuser(), "name": "raw", "failover_timeout": 60}
    assert post(url, {"type": "SUBSCRIBE"})[0] == 401  # no credentials
    sub = subscribe(url, info, basic(*ALICE))
    assert isinstance(sub, Subscription), sub
    try:
        subscribed = sub.wait(lambda e: e["type"] == "SUBSCRIBED")["subscribed"]
        fid = subscribed["framework_id"]
        assert subscribed["heartbeat_interval_seconds"] > 0
        offer = _offer(sub)

        # An offer id the master never made: the tasks are LOST (not partition-aware).
        bad = {
            "type": "ACCEPT",
            "framework_id": fid,
            "accept": {
                "offer_ids": [{"value": "no-such-offer"}],
                "operations": [{"type": "LAUNCH", "launch": {"task_infos": [_task("x", offer)]}}],
            },
        }
        assert sub.call(bad, url) == (202, "")
        lost = _update_of(sub, "x")
        assert (lost["state"], lost["reason"]) == ("TASK_LOST", "REASON_INVALID_OFFERS")

        # A task id used twice in one launch: the second is an ERROR, the first runs.
        twice = [_task("dup", offer), _task("dup", offer)]
        accept = {
            "type": "ACCEPT",
            "framework_id": fid,
            "accept": {
                "offer_ids": [offer["id"]],
                "operations": [{"type": "LAUNCH", "launch": {"task_infos": twice}}],
                "filters": {"refuse_seconds": 0},
            },
        }
        assert sub.call(accept, url)[0] == 202
        states = {_update_of(sub, "dup")["state"], _update_of(sub, "dup")["state"]}
        assert "TASK_ERROR" in states

        decline = {"type": "DECLINE", "framework_id": fid, "decline": {"offer_ids": []}}
        alice = basic(*ALICE)
        status, text, _ = post(url, decline, {**alice, "Mesos-Stream-Id": "not-the-stream"})
        assert status == 400 and "didn't match the stream ID" in text
        status, text, _ = post(url, decline, alice)
        assert status == 400 and "'Mesos-Stream-Id' header" in text
        unknown = {**decline, "framework_id": {"value": "no-such-framework"}}
        assert post(url, unknown, alice)[:2] == (400, "Framework cannot be found")

        # Another principal: not with alice's framework, not in alice's name.
        bob = basic(*BOB)
        status, text, _ = post(url, decline, {**bob, "Mesos-Stream-Id": sub.stream_id})
        assert status == 400 and "'bob' does not match principal 'alice'" in text
        status, text = _refused(subscribe(url, {**info, "principal": "alice"}, bob))
        assert status == 400 and "does not match" in text
        taken = subscribe(url, {**info, "id": fid}, bob)
        assert isinstance(taken, Subscription)
        error = taken.wait(lambda e: e["type"] == "ERROR")["error"]["message"]
        assert "belongs to another principal" in error
        assert taken.next_event() is None  # and the master closed that stream
        taken.close()
        sub.call({"type": "DECLINE", "framework_id": fid, "decline": {"offer_ids": []}}, url)
        assert sub.call(decline, url)[0] == 202  # alice's stream is untouched

        # What Agora does not speak: protobuf, calls it lacks, bodies that are not calls.
        status, text, _ = post(
            url, None, {**alice, "Content-Type": "application/x-protobuf"}, raw=b"\x08\x01"
        )
        assert status == 415
        update_fw = {"type": "UPDATE_FRAMEWORK", "framework_id": fid}
        assert post(url, update_fw, {**alice, "Mesos-Stream-Id": sub.stream_id})[0] == 501
        assert post(url, None, alice, raw=b"{not json")[0] == 400
        assert (
            post(url, {"type": "ACCEPT", "framework_id": fid, "accept": {"offer_ids": "x"}}, alice)[
                0
            ]
            == 400
        )
        assert post(url, {"type": "NO_SUCH_CALL"}, alice)[0] == 400
    finally:
        sub.close()
    # Hanging up disconnects the framework; its failover timeout (60 s) keeps it meanwhile.
    wait_for(
        lambda: any(
            f.framework_id == fid["value"] and not f.connected for f in cluster.state().frameworks
        ),
        20,
        "the framework to be disconnected",
    )


def _refused(answer: Subscription | tuple[int, str]) -> tuple[int, str]:
    assert not isinstance(answer, Subscription), "the subscription should have been refused"
    return answer
