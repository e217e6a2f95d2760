"""An MPI job, how its gang offer becomes members, and how ``mpirun`` is started. Pure.

A *member* is one agent of the gang: it gets one placeholder executor holding that agent's
slots, named in the hostfile by the member's name (also its container's host name, so Open MPI's
shared-memory files, named after the host, never collide between members on one machine).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agora.sdk.ids import AgentID, GangID
from agora.sdk.messages import GangRequest, Offer
from agora.sdk.messages.enums import Placement
from agora.sdk.resources import Resources
from agora.sdk.scheduler.spec import fit_resources

__all__ = ["Member", "MpiJob", "hostfile", "members_for", "mpirun_argv", "mpirun_env"]

MAX_RANKS = 1024


@dataclass(frozen=True, slots=True)
class MpiJob:
    """``ranks`` ranks of ``cpus``/``mem`` (MiB) each, at most ``per_node`` on one agent (0: no
    cap), running ``command``; ``timeout`` seconds per attempt (None: none); ``retries`` extra
    attempts; ``interface`` the network interface (or CIDR) Open MPI uses between agents."""

    ranks: int
    command: tuple[str, ...]
    cpus: float = 1.0
    mem: float = 256.0
    per_node: int = 0
    timeout: float | None = None
    retries: int = 0
    interface: str = "lo"
    role: str = "*"
    environment: Mapping[str, str] = field(default_factory=dict)
    #: Where the ranks start (mpirun --wdir); "" leaves it to mpirun (the executor's sandbox).
    workdir: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.ranks <= MAX_RANKS:
            raise ValueError(f"-n must be between 1 and {MAX_RANKS}")
        if not self.command:
            raise ValueError("give the program after --, e.g. -- python -m mpi4py app.py")
        if not (math.isfinite(self.cpus) and 0.001 <= self.cpus <= 1024):
            raise ValueError("--cpus-per-rank must be between 0.001 and 1024")
        if not (math.isfinite(self.mem) and 1 <= self.mem <= 1 << 30):
            raise ValueError("--mem-per-rank must be between 1 MiB and 1 PiB")
        if not 0 <= self.per_node <= MAX_RANKS:
            raise ValueError(f"--ntasks-per-node must be between 0 and {MAX_RANKS}")
        if self.timeout is not None and not (0 < self.timeout <= 365 * 86400):
            raise ValueError("--timeout must be more than 0")
        if not 0 <= self.retries <= 100:
            raise ValueError("--retries must be between 0 and 100")
        if not self.interface or any(c.isspace() or c == "," for c in self.interface):
            raise ValueError(f"bad interface {self.interface!r}")
        if self.workdir and not self.workdir.startswith("/"):
            raise ValueError(f"the working directory must be absolute, not {self.workdir!r}")

    @property
    def shape(self) -> Resources:
        return Resources.parse(f"cpus:{_num(self.cpus)};mem:{_num(self.mem)}")

    def gang(self, gang_id: str, hold_timeout: float = 300.0) -> GangRequest:
        return GangRequest(
            gang_id=GangID(gang_id),
            role=self.role,
            count=self.ranks,
            shape=self.shape,
            placement=Placement.DISTINCT if self.per_node == 1 else Placement.ANY,
            hold_timeout=hold_timeout,
            max_per_agent=self.per_node,
        )


@dataclass(frozen=True, slots=True)
class Member:
    """One agent of the gang: its offer(s), its slots and the resources they hold."""

    index: int
    name: str
    agent_id: AgentID
    offer_ids: tuple[str, ...]
    slots: int
    resources: Resources


def members_for(job: MpiJob, bundle: Sequence[Offer]) -> list[Member]:
    """The members of a gang bundle, rank 0's first; ValueError when it cannot hold the job."""
    by_agent: dict[AgentID, list[Offer]] = {}
    for offer in bundle:
        by_agent.setdefault(offer.agent_id, []).append(offer)
    members: list[Member] = []
    left = job.ranks
    names: set[str] = set()
    shape = job.shape
    for agent_id, offers in by_agent.items():
        if left == 0:
            break
        role = offers[0].role
        total = Resources()
        for offer in offers:
            total = total + offer.resources
        slots, held, free = 0, Resources(), total
        while left - slots > 0 and (not job.per_node or slots < job.per_node):
            used = fit_resources(shape, free, role)
            if used is None:
                break
            slots, held, free = slots + 1, held + used, free - used
        if not slots:
            continue
        name = _unique(offers[0].hostname or str(agent_id), names)
        members.append(
            Member(
                index=len(members),
                name=name,
                agent_id=agent_id,
                offer_ids=tuple(o.offer_id for o in offers),
                slots=slots,
                resources=held,
            )
        )
        left -= slots
    if left:
        raise ValueError(f"the gang offer holds {job.ranks - left} of {job.ranks} ranks")
    return members


def hostfile(members: Sequence[Member]) -> str:
    return "".join(f"{m.name} slots={m.slots}\n" for m in members)


def mpirun_argv(job: MpiJob, hostfile_path: str) -> list[str]:
    argv = ["mpirun", "--hostfile", hostfile_path, "-n", str(job.ranks), "--tag-output"]
    if job.timeout is not None:
        argv += ["--timeout", str(max(1, math.ceil(job.timeout)))]
    if job.workdir:
        argv += ["--wdir", job.workdir]
    return [*argv, *job.command]


def mpirun_env(
    job: MpiJob, launcher: Sequence[str], socket_path: str, *, as_root: bool
) -> dict[str, str]:
    """What ``mpirun`` needs in its environment (the note's settings), on top of the
    executor's own."""
    env = {
        "OMPI_MCA_plm_rsh_agent": shlex.join(launcher),
        "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
        "OMPI_MCA_orte_leave_session_attached": "1",
        "OMPI_MCA_oob_tcp_if_include": job.interface,
        "OMPI_MCA_btl_tcp_if_include": job.interface,
        "OMPI_MCA_btl": "self,vader,tcp",
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_mpi_yield_when_idle": "1",
        # Member names are the agents' host names: keep their domains when mpirun calls the
        # launcher, or "node2.example.com" comes as "node2" and matches no member.
        "OMPI_MCA_orte_keep_fqdn_hostnames": "1",
        "AGORA_MPI_LAUNCH_SOCKET": socket_path,
        **job.environment,
    }
    if as_root:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def _unique(name: str, taken: set[str]) -> str:
    base = "".join(c if c.isalnum() or c in "-." else "-" for c in name)[:48] or "member"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    taken.add(candidate)
    return candidate


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")
