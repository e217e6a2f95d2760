"""A multi-host test rig on one Linux machine (needs root, `ip` and `nft`).

One "hub" network namespace holds a Linux bridge; each of N host namespaces has a veth whose
other end is a port of that bridge. Host i has 10.<net>.0.<i+1>/24 and `lo` up. Faults are
nftables rules in the sending host's namespace keyed on the destination address, so one rule
cuts exactly one direction of one link, established TCP connections included.

Everything is named `agora-rig-<name>-...` and lives only inside the rig's namespaces, so
`down()` or `cleanup_stale()` removes it all, even after a crash.

    with Rig.create(3) as rig:
        server = rig.popen(0, ["python3", "-m", "http.server", "--bind", rig.hosts[0].address])
        rig.cut(0, 1)        # 0 <-> 1 drop, 0 <-> 2 untouched
        rig.heal()

CLI: python deploy/rig.py up --hosts 3 --name demo | exec demo 1 -- CMD... | cut demo 0 1 |
loss demo 0 1 30 | delay demo 0 1 50 | isolate demo 0 | partition demo 0 1,2 | heal demo |
show demo | down demo | cleanup
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import _rig_net as net
from _rig_net import PREFIX, RigError, RigUnsupported

__all__ = ["Rig", "RigError", "RigHost", "RigUnsupported", "cleanup_stale", "missing_tools"]

log = structlog.get_logger(__name__)


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Remove every rig namespace (and so its links, bridge, nft tables) whose name starts with
    prefix, killing processes inside first. Returns the namespace names removed."""
    return net.cleanup_stale(prefix)


def missing_tools() -> list[str]:
    """Why the rig cannot run here: not root, or `ip`/`nft`/`tc` missing. Empty when it can."""
    problems = [] if os.geteuid() == 0 else ["not root"]
    problems += [f"{tool} not installed" for tool in ("ip", "nft", "tc") if not shutil.which(tool)]
    return problems


@dataclass(frozen=True)
class RigHost:
    index: int
    name: str  # network namespace
    address: str


@dataclass
class Rig:
    name: str
    net: int
    hosts: tuple[RigHost, ...]
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.name}-"

    @property
    def table(self) -> str:
        return net.table_name(self.name)

    @classmethod
    def create(cls, hosts: int, *, name: str | None = None) -> Rig:
        """Build a rig of `hosts` hosts; raise RigError if a rig of that name already exists."""
        if hosts < 1 or hosts > 200:
            raise ValueError("hosts must be in 1..200")
        name = name or uuid.uuid4().hex[:8]
        if not net.NAME_RE.match(name):
            raise ValueError(f"rig name {name!r} must match {net.NAME_RE.pattern}")
        prefix = f"{PREFIX}{name}-"
        if net.hub_ns(prefix) in net.list_netns() or net.host_namespaces(prefix):
            raise RigError(f"rig {name!r} already exists (down it or run cleanup)")
        octet = net.choose_net(name)
        try:
            addresses = net.create_rig_network(prefix, net.table_name(name), octet, hosts)
        except BaseException:
            _remove(prefix, hosts)
            raise
        members = tuple(
            RigHost(i, net.host_ns(prefix, i), addr) for i, addr in enumerate(addresses)
        )
        log.info("rig_up", rig=name, hosts=hosts, net=f"10.{octet}.0.0/24")
        return cls(name=name, net=octet, hosts=members)

    @classmethod
    def attach(cls, name: str) -> Rig:
        """The live rig called name (for the CLI, or another process); RigError if none."""
        prefix = f"{PREFIX}{name}-"
        found = net.host_namespaces(prefix)
        if not found or sorted(found) != list(range(len(found))):
            raise RigError(f"no rig named {name!r} (hosts found: {sorted(found)})")
        members = []
        for i in range(len(found)):
            addr = net.host_address(found[i])
            if addr is None:
                raise RigError(f"rig {name!r} host {i} has no address")
            members.append(RigHost(i, found[i], addr))
        return cls(name=name, net=int(members[0].address.split(".")[1]), hosts=tuple(members))

    def __enter__(self) -> Rig:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    def _host(self, index: int) -> RigHost:
        if not 0 <= index < len(self.hosts):
            raise IndexError(f"rig {self.name!r} has no host {index}")
        return self.hosts[index]

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """argv prefixed so that it runs inside the host's namespace."""
        return ["ip", "netns", "exec", self._host(host).name, *argv]

    def popen(self, host: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start argv inside the host (own session, so down() kills its whole group)."""
        kwargs.setdefault("start_new_session", True)
        proc: subprocess.Popen[bytes] = subprocess.Popen(self.command(host, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def _pair(self, a: int, b: int) -> tuple[RigHost, RigHost]:
        src, dst = self._host(a), self._host(b)
        if a == b:
            raise ValueError("a fault needs two different hosts")
        return src, dst

    def _drop(self, a: int, b: int, percent: int, kind: str) -> None:
        src, dst = self._pair(a, b)
        net.add_drop(src.name, self.table, dst.address, f"{kind} {a}->{b}", percent)

    def cut(self, a: int, b: int, *, both: bool = True) -> None:
        """Drop every packet a->b (and b->a when both), established connections included."""
        self._drop(a, b, 100, "cut")
        if both:
            self._drop(b, a, 100, "cut")
        log.info("rig_cut", rig=self.name, a=a, b=b, both=both)

    def isolate(self, a: int) -> None:
        """Cut a from every other host, both ways."""
        for b in range(len(self.hosts)):
            if b != a:
                self.cut(a, b)

    def partition(self, *groups: Sequence[int]) -> None:
        """Hosts talk only within their group; a host in no group is cut from every group."""
        group_of: dict[int, int] = {}
        for g, members in enumerate(groups):
            for h in members:
                self._host(h)
                if h in group_of:
                    raise ValueError(f"host {h} is in two groups")
                group_of[h] = g
        n = len(self.hosts)
        for a in range(n):
            for b in range(n):
                if a != b and (a not in group_of or group_of.get(b) != group_of[a]):
                    self._drop(a, b, 100, "cut")
        log.info("rig_partition", rig=self.name, groups=[list(g) for g in groups])

    def loss(self, a: int, b: int, percent: int) -> None:
        """Drop a random `percent` of packets a->b (0 removes the loss on that link)."""
        if not 0 <= percent <= 100:
            raise ValueError("percent must be in 0..100")
        self._drop(a, b, percent, "loss")
        log.info("rig_loss", rig=self.name, a=a, b=b, percent=percent)

    def delay(self, a: int, b: int, ms: float, jitter_ms: float = 0) -> None:
        """Delay packets a->b by ms (± jitter) with tc netem; RigUnsupported without netem."""
        src, dst = self._pair(a, b)
        problem = net.netem_problem(src.name)
        if problem:
            raise RigUnsupported(problem)
        net.add_delay(src.name, b, dst.address, ms, jitter_ms)
        log.info("rig_delay", rig=self.name, a=a, b=b, ms=ms, jitter_ms=jitter_ms)

    def heal(self) -> None:
        """Remove every fault (nft rules and tc delay) from every host."""
        for h in self.hosts:
            net.flush_faults(h.name, self.table)
        log.info("rig_heal", rig=self.name)

    def down(self) -> None:
        """Kill the processes the rig started (and any left in its namespaces), remove it all."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("rig_process_stuck", rig=self.name, pid=proc.pid)
        self._procs.clear()
        _remove(self.prefix, len(self.hosts))
        log.info("rig_down", rig=self.name)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "net": f"10.{self.net}.0.0/24",
            "hosts": [{"index": h.index, "name": h.name, "address": h.address} for h in self.hosts],
        }


def _remove(prefix: str, hosts: int) -> None:
    """Delete the rig's namespaces: hosts (including any beyond `hosts`) first, hub last."""
    names = {net.host_ns(prefix, i) for i in range(hosts)}
    names |= set(net.host_namespaces(prefix).values())
    for ns in sorted(names):
        net.delete_netns(ns)
    net.delete_netns(net.hub_ns(prefix))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rig.py", description="Agora multi-host test rig")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create a rig, print its hosts as JSON")
    up.add_argument("--hosts", type=int, default=3)
    up.add_argument("--name")
    ex = sub.add_parser("exec", help="run a command in a host: exec NAME HOST -- CMD...")
    ex.add_argument("name")
    ex.add_argument("host", type=int)
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    for cmd in ("cut", "loss", "delay"):
        s = sub.add_parser(cmd)
        s.add_argument("name")
        s.add_argument("a", type=int)
        s.add_argument("b", type=int)
        if cmd == "cut":
            s.add_argument("--one-way", action="store_true", help="only a->b")
        elif cmd == "loss":
            s.add_argument("percent", type=int)
        else:
            s.add_argument("ms", type=float)
            s.add_argument("--jitter", type=float, default=0.0)
    iso = sub.add_parser("isolate")
    iso.add_argument("name")
    iso.add_argument("a", type=int)
    part = sub.add_parser("partition", help="partition NAME 0 1,2 (one arg per group)")
    part.add_argument("name")
    part.add_argument("groups", nargs="+")
    for cmd in ("heal", "show", "down"):
        sub.add_parser(cmd).add_argument("name")
    clean = sub.add_parser("cleanup", help="remove every rig (or those with --prefix)")
    clean.add_argument("--prefix", default=PREFIX)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "up":
            print(json.dumps(Rig.create(args.hosts, name=args.name).describe()))
            return 0
        if args.cmd == "cleanup":
            print(json.dumps(cleanup_stale(args.prefix)))
            return 0
        rig = Rig.attach(args.name)
        if args.cmd == "exec":
            cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not cmd:
                raise ValueError("exec needs a command after --")
            os.execvp("ip", rig.command(args.host, cmd))
        elif args.cmd == "cut":
            rig.cut(args.a, args.b, both=not args.one_way)
        elif args.cmd == "loss":
            rig.loss(args.a, args.b, args.percent)
        elif args.cmd == "delay":
            rig.delay(args.a, args.b, args.ms, args.jitter)
        elif args.cmd == "isolate":
            rig.isolate(args.a)
        elif args.cmd == "partition":
            rig.partition(*[[int(h) for h in g.split(",") if h] for g in args.groups])
        elif args.cmd == "heal":
            rig.heal()
        elif args.cmd == "show":
            print(json.dumps(rig.describe()))
        elif args.cmd == "down":
            rig.down()
    except (RigError, RigUnsupported, ValueError, IndexError) as exc:
        print(f"rig.py {args.cmd}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, RigUnsupported) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
