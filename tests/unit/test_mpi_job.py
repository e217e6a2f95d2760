"""An MPI job's checks, its gang request, how a gang offer becomes members, and how mpirun is
started (argv, environment, hostfile)."""

from __future__ import annotations

import math
import shlex
from typing import Any

import pytest
from agora.frameworks.mpi.job import Member, MpiJob, hostfile, members_for, mpirun_argv, mpirun_env
from agora.sdk.ids import AgentID, FrameworkID, GangID, OfferID
from agora.sdk.messages import Offer
from agora.sdk.messages.enums import Placement
from agora.sdk.resources import Resources

CMD = ("python", "-m", "mpi4py", "app.py")


def job(**kw: Any) -> MpiJob:
    kw.setdefault("ranks", 4)
    kw.setdefault("command", CMD)
    return MpiJob(**kw)


def offer(oid: str, agent: str, res: str, host: str | None = None, role: str = "*") -> Offer:
    return Offer(
        offer_id=OfferID(oid),
        framework_id=FrameworkID("fw"),
        agent_id=AgentID(agent),
        hostname=host if host is not None else f"host-{agent}",
        role=role,
        resources=Resources.parse(res),
        gang_id=GangID("g"),
    )


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"ranks": 0}, "-n must be between 1 and 1024"),
        ({"ranks": 1025}, "-n must be between 1 and 1024"),
        ({"command": ()}, "give the program after --"),
        ({"cpus": 0.0}, "--cpus-per-rank must be between"),
        ({"cpus": math.nan}, "--cpus-per-rank must be between"),
        ({"cpus": math.inf}, "--cpus-per-rank must be between"),
        ({"mem": 0.5}, "--mem-per-rank must be between"),
        ({"mem": math.nan}, "--mem-per-rank must be between"),
        ({"per_node": -1}, "--ntasks-per-node must be between"),
        ({"timeout": 0.0}, "--timeout must be more than 0"),
        ({"timeout": -5.0}, "--timeout must be more than 0"),
        ({"timeout": math.nan}, "--timeout must be more than 0"),
        ({"retries": -1}, "--retries must be between 0 and 100"),
        ({"retries": 101}, "--retries must be between 0 and 100"),
        ({"interface": ""}, "bad interface"),
        ({"interface": "eth0,eth1"}, "bad interface"),
        ({"interface": "eth 0"}, "bad interface"),
        ({"workdir": "relative/dir"}, "must be absolute"),
    ],
)
def test_bad_jobs_are_refused_with_a_message_naming_the_option(
    kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        job(**kw)


def test_limits_themselves_are_accepted() -> None:
    job(ranks=1, cpus=0.001, mem=1, per_node=0, retries=0, timeout=0.5)
    job(ranks=1024, cpus=1024, per_node=1024, retries=100, interface="10.0.0.0/24", workdir="/")


# ------------------------------------------------------------------ shape and gang


def test_shape_is_one_rank() -> None:
    assert job(cpus=0.5, mem=100).shape == Resources.parse("cpus:0.5;mem:100")
    assert job().shape == Resources.parse("cpus:1;mem:256")


def test_gang_of_one_rank_per_node_is_distinct() -> None:
    gang = job(ranks=3, per_node=1, role="batch").gang("g-1", hold_timeout=42.0)
    assert gang.gang_id == GangID("g-1")
    assert gang.placement is Placement.DISTINCT
    assert (gang.count, gang.max_per_agent, gang.role, gang.hold_timeout) == (3, 1, "batch", 42.0)
    assert gang.shape == job().shape


@pytest.mark.parametrize("per_node", [0, 2])
def test_gang_otherwise_lands_anywhere_with_the_cap(per_node: int) -> None:
    gang = job(ranks=6, per_node=per_node).gang("g")
    assert gang.placement is Placement.ANY
    assert (gang.count, gang.max_per_agent) == (6, per_node)


# ------------------------------------------------------------------ members


def test_two_agents_make_two_members_rank0_first() -> None:
    bundle = [
        offer("o1", "a1", "cpus:2;mem:1024"),
        offer("o2", "a2", "cpus:2;mem:1024"),
    ]
    members = members_for(job(ranks=4), bundle)
    assert [(m.index, m.name, m.agent_id, m.offer_ids, m.slots) for m in members] == [
        (0, "host-a1", "a1", ("o1",), 2),
        (1, "host-a2", "a2", ("o2",), 2),
    ]
    assert all(m.resources == Resources.parse("cpus:2;mem:512") for m in members)


def test_slots_follow_what_each_agent_holds() -> None:
    bundle = [
        offer("o1", "a1", "cpus:3;mem:4096"),
        offer("o2", "a2", "cpus:8;mem:256"),  # memory allows one rank only
    ]
    members = members_for(job(ranks=4), bundle)
    assert [(m.name, m.slots) for m in members] == [("host-a1", 3), ("host-a2", 1)]
    assert members[0].resources == Resources.parse("cpus:3;mem:768")


def test_offers_of_one_agent_make_one_member() -> None:
    bundle = [
        offer("o1", "a1", "cpus:1;mem:256"),
        offer("o2", "a2", "cpus:1;mem:256"),
        offer("o3", "a1", "cpus:1;mem:256"),
    ]
    members = members_for(job(ranks=3), bundle)
    assert [(m.agent_id, m.offer_ids, m.slots) for m in members] == [
        ("a1", ("o1", "o3"), 2),
        ("a2", ("o2",), 1),
    ]


def test_an_agent_not_needed_is_left_out() -> None:
    bundle = [offer("o1", "a1", "cpus:4;mem:4096"), offer("o2", "a2", "cpus:4;mem:4096")]
    members = members_for(job(ranks=3), bundle)
    assert [(m.agent_id, m.slots) for m in members] == [("a1", 3)]


def test_per_node_cap_is_respected() -> None:
    bundle = [offer(f"o{i}", f"a{i}", "cpus:8;mem:8192") for i in range(3)]
    members = members_for(job(ranks=5, per_node=2), bundle)
    assert [m.slots for m in members] == [2, 2, 1]
    members = members_for(job(ranks=3, per_node=1), bundle)
    assert [m.slots for m in members] == [1, 1, 1]


def test_per_node_cap_that_the_bundle_cannot_meet_is_an_error() -> None:
    bundle = [offer("o1", "a1", "cpus:8;mem:8192"), offer("o2", "a2", "cpus:8;mem:8192")]
    with pytest.raises(ValueError, match="holds 2 of 3 ranks"):
        members_for(job(ranks=3, per_node=1), bundle)


def test_duplicate_hostnames_are_made_unique() -> None:
    bundle = [
        offer("o1", "a1", "cpus:1;mem:256", host="node"),
        offer("o2", "a2", "cpus:1;mem:256", host="node"),
        offer("o3", "a3", "cpus:1;mem:256", host="node"),
    ]
    names = [m.name for m in members_for(job(ranks=3), bundle)]
    assert len(set(names)) == 3
    assert names[0] == "node"


def test_names_are_safe_in_a_hostfile() -> None:
    bundle = [
        offer("o1", "a1", "cpus:1;mem:256", host="bad host/name slots=9"),
        offer("o2", "agent-2", "cpus:1;mem:256", host=""),
    ]
    members = members_for(job(ranks=2), bundle)
    for m in members:
        assert m.name and all(c.isalnum() or c in "-." for c in m.name), m.name
    assert members[1].name == "agent-2"  # no host name: the agent id


def test_too_small_a_bundle_is_an_error() -> None:
    bundle = [offer("o1", "a1", "cpus:2;mem:1024"), offer("o2", "a2", "cpus:0.5;mem:1024")]
    with pytest.raises(ValueError, match="holds 2 of 3 ranks"):
        members_for(job(ranks=3), bundle)
    with pytest.raises(ValueError):
        members_for(job(ranks=1), [])


def test_reserved_resources_of_the_role_are_used() -> None:
    bundle = [offer("o1", "a1", "cpus(gpu):2;mem(gpu):512", role="gpu")]
    (member,) = members_for(job(ranks=2, role="gpu"), bundle)
    assert member.slots == 2
    assert member.resources == Resources.parse("cpus(gpu):2;mem(gpu):512")


# ------------------------------------------------------------------ starting mpirun


def test_hostfile_lists_each_member_with_its_slots_in_order() -> None:
    members = [
        Member(0, "n0", AgentID("a"), ("o",), 3, Resources()),
        Member(1, "n1", AgentID("b"), ("p",), 1, Resources()),
    ]
    assert hostfile(members) == "n0 slots=3\nn1 slots=1\n"


def test_mpirun_argv() -> None:
    argv = mpirun_argv(job(ranks=6), "/tmp/h")
    assert argv == ["mpirun", "--hostfile", "/tmp/h", "-n", "6", "--tag-output", *CMD]


@pytest.mark.parametrize(("timeout", "word"), [(2.1, "3"), (60.0, "60"), (0.2, "1")])
def test_mpirun_timeout_is_rounded_up(timeout: float, word: str) -> None:
    argv = mpirun_argv(job(timeout=timeout), "h")
    assert argv[argv.index("--timeout") + 1] == word


def test_mpirun_wdir_and_the_command_last() -> None:
    argv = mpirun_argv(job(timeout=5, workdir="/srv/run", command=("./ring", "--wdir")), "h")
    assert argv[argv.index("--wdir") + 1] == "/srv/run"
    assert argv[-2:] == ["./ring", "--wdir"]
    assert argv.index("--timeout") < argv.index("./ring")
    assert argv.index("--wdir") < argv.index("./ring")


def test_mpirun_env_has_the_notes_settings() -> None:
    launcher = ["/usr/bin/python 3", "-m", "agora.frameworks.mpi.launcher"]
    env = mpirun_env(job(interface="10.1.0.0/16"), launcher, "/run/s.sock", as_root=False)
    assert shlex.split(env["OMPI_MCA_plm_rsh_agent"]) == launcher
    assert env["OMPI_MCA_plm_rsh_no_tree_spawn"] == "1"
    assert env["OMPI_MCA_orte_leave_session_attached"] == "1"
    assert env["OMPI_MCA_oob_tcp_if_include"] == "10.1.0.0/16"
    assert env["OMPI_MCA_btl_tcp_if_include"] == "10.1.0.0/16"
    assert env["OMPI_MCA_btl"] == "self,vader,tcp"
    assert env["OMPI_MCA_pml"] == "ob1"
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert env["AGORA_MPI_LAUNCH_SOCKET"] == "/run/s.sock"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env
    assert "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM" not in env


def test_mpirun_env_as_root_and_the_jobs_own_environment() -> None:
    env = mpirun_env(job(environment={"MY_VAR": "x"}), ["l"], "s", as_root=True)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert env["MY_VAR"] == "x"
