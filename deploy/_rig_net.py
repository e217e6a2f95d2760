"""Low-level helpers for deploy/rig.py: run `ip`, `nft` and `tc`, create and remove network
namespaces, and build the nftables/tc commands that inject faults.

Everything here names what it makes with the rig's prefix, so a crashed rig can be found and
removed later from the namespace names alone."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import zlib
from collections.abc import Sequence

import structlog

log = structlog.get_logger(__name__)

PREFIX = "agora-rig-"
HOST_IF = "eth0"  # the host end of each veth, inside the host namespace
BRIDGE = "br0"  # inside the hub namespace
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")


class RigError(RuntimeError):
    """A command the rig ran failed, or the rig is in a state it cannot handle."""


class RigUnsupported(RuntimeError):
    """The kernel lacks something a fault needs (for example netem for delay)."""


def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run a command, return its stdout; raise RigError with its stderr when it fails."""
    proc = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if check and proc.returncode != 0:
        raise RigError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def hub_ns(prefix: str) -> str:
    return f"{prefix}hub"


def host_ns(prefix: str, index: int) -> str:
    return f"{prefix}h{index}"


def table_name(name: str) -> str:
    """nftables identifiers take no '-': the rig's table inside each host namespace."""
    return "agora_rig_" + name.replace("-", "_")


def list_netns() -> list[str]:
    out = run(["ip", "-j", "netns", "list"]).strip()
    if not out:
        return []
    return [str(entry["name"]) for entry in json.loads(out)]


def host_namespaces(prefix: str) -> dict[int, str]:
    """Host index -> namespace name for every host namespace of the rig with this prefix."""
    pattern = re.compile("^" + re.escape(prefix) + r"h(\d+)$")
    found: dict[int, str] = {}
    for ns in list_netns():
        m = pattern.match(ns)
        if m:
            found[int(m.group(1))] = ns
    return found


def host_address(ns: str) -> str | None:
    """The IPv4 address on the host end of the veth in namespace ns, if any."""
    out = run(["ip", "-n", ns, "-j", "-4", "addr", "show", "dev", HOST_IF], check=False)
    if not out.strip():
        return None
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                return str(info["local"])
    return None


def used_nets() -> set[int]:
    """Second octets of 10.X.0.0/24 already taken by any live rig."""
    taken: set[int] = set()
    for ns in list_netns():
        if ns.startswith(PREFIX) and re.search(r"-h\d+$", ns):
            addr = host_address(ns)
            if addr is not None and addr.startswith("10."):
                taken.add(int(addr.split(".")[1]))
    return taken


def choose_net(name: str) -> int:
    """A second octet in 100..249 derived from the name, moved on past ones other rigs use."""
    start = zlib.crc32(name.encode()) % 150
    taken = used_nets()
    for step in range(150):
        net = 100 + (start + step) % 150
        if net not in taken:
            return net
    raise RigError("no free 10.X.0.0/24 network for another rig")


def create_rig_network(prefix: str, table: str, net: int, hosts: int) -> list[str]:
    """Hub with a bridge, then one namespace per host joined to it; returns host addresses.

    Both veth ends are created directly inside their namespaces, so nothing of the rig ever
    lives in the root namespace and deleting the namespaces removes every link."""
    hub = hub_ns(prefix)
    run(["ip", "netns", "add", hub])
    run(["ip", "-n", hub, "link", "add", BRIDGE, "type", "bridge", "forward_delay", "0"])
    run(["ip", "-n", hub, "link", "set", BRIDGE, "up"])
    addresses: list[str] = []
    for i in range(hosts):
        ns = host_ns(prefix, i)
        port = f"p{i}"
        address = f"10.{net}.0.{i + 1}"
        run(["ip", "netns", "add", ns])
        run(
            [
                "ip",
                "link",
                "add",
                HOST_IF,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                hub,
            ]
        )
        run(["ip", "-n", hub, "link", "set", port, "master", BRIDGE, "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", HOST_IF])
        run(["ip", "-n", ns, "link", "set", HOST_IF, "up"])
        hook = "{{ type filter hook {0} priority 0; }}"
        nft(
            ns,
            f"add table inet {table}\n"
            f"add chain inet {table} output {hook.format('output')}\n"
            f"add chain inet {table} input {hook.format('input')}\n",
        )
        addresses.append(address)
    return addresses


def nft(ns: str, script: str) -> None:
    """Apply an nft script atomically inside namespace ns."""
    run(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin=script)


def delete_rules(ns: str, table: str, chain: str, comment: str) -> None:
    """Remove every rule of the chain that carries exactly this comment."""
    out = run(["ip", "netns", "exec", ns, "nft", "-j", "-a", "list", "chain", "inet", table, chain])
    for item in json.loads(out).get("nftables", []):
        rule = item.get("rule")
        if rule and rule.get("comment") == comment:
            nft(ns, f"delete rule inet {table} {chain} handle {rule['handle']}\n")


def add_drop(ns: str, table: str, daddr: str, comment: str, percent: int = 100) -> None:
    """Drop (all, or a random percent of) packets from ns to daddr; replaces a same-comment rule."""
    delete_rules(ns, table, "output", comment)
    if percent <= 0:
        return
    match = f"ip daddr {daddr}"
    if percent < 100:
        match += f" numgen random mod 100 < {percent}"
    nft(ns, f'add rule inet {table} output {match} counter drop comment "{comment}"\n')


def flush_faults(ns: str, table: str) -> None:
    nft(ns, f"flush chain inet {table} output\nflush chain inet {table} input\n")
    run(["tc", "-n", ns, "qdisc", "del", "dev", HOST_IF, "root"], check=False)


_netem: str | None = None  # "" when supported, else why not; probed once per process


def netem_problem(ns: str) -> str:
    """Probe once whether tc netem works; return '' if so, else the reason."""
    global _netem
    if _netem is None:
        proc = subprocess.run(
            ["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode == 0:
            run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
            _netem = ""
        else:
            _netem = f"tc netem unavailable: {proc.stderr.strip() or proc.returncode}"
    return _netem


def add_delay(ns: str, dst_index: int, daddr: str, ms: float, jitter_ms: float) -> None:
    """Delay packets from ns to daddr: an htb class per destination with a netem leaf, chosen by
    a u32 filter on the destination address. Other traffic goes to the default class."""
    dev = ["dev", HOST_IF]
    has_root = "htb 1:" in run(["tc", "-n", ns, "qdisc", "show", *dev])
    if not has_root:
        run(["tc", "-n", ns, "qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "1"])
        run(
            [
                "tc",
                "-n",
                ns,
                "class",
                "add",
                *dev,
                "parent",
                "1:",
                "classid",
                "1:1",
                "htb",
                "rate",
                "10gbit",
            ]
        )
    cls = f"1:{dst_index + 10:x}"
    leaf = f"{dst_index + 10:x}:"
    classes = run(["tc", "-n", ns, "class", "show", *dev])
    verb = "change" if f"class htb {cls} " in classes else "add"
    run(
        [
            "tc",
            "-n",
            ns,
            "class",
            verb,
            *dev,
            "parent",
            "1:",
            "classid",
            cls,
            "htb",
            "rate",
            "10gbit",
        ]
    )
    netem = ["netem", "delay", f"{ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
    if verb == "add":
        run(["tc", "-n", ns, "qdisc", "add", *dev, "parent", cls, "handle", leaf, *netem])
        run(
            [
                "tc",
                "-n",
                ns,
                "filter",
                "add",
                *dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "dst",
                f"{daddr}/32",
                "flowid",
                cls,
            ]
        )
    else:
        run(["tc", "-n", ns, "qdisc", "change", *dev, "parent", cls, "handle", leaf, *netem])


def netns_pids(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(tok) for tok in out.split() if tok.isdigit()]


def kill_netns_processes(ns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process inside ns and wait until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            log.warning("rig_processes_left", netns=ns, pids=pids)
            return
        time.sleep(0.02)


def delete_netns(ns: str) -> None:
    kill_netns_processes(ns)
    run(["ip", "netns", "del", ns], check=False)


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Remove every namespace whose name starts with prefix (hosts first, hub last), killing the
    processes inside; the veths, bridge and nft tables go with them. Returns what it removed."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"prefix must start with {PREFIX!r}")
    found = sorted(ns for ns in list_netns() if ns.startswith(prefix))
    found.sort(key=lambda ns: ns.endswith("-hub"))
    for ns in found:
        delete_netns(ns)
    if found:
        log.info("rig_cleanup", prefix=prefix, removed=found)
    return found
