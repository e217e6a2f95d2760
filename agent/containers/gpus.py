"""NVIDIA GPUs: finding them (nvidia-smi), and which container holds which.

The pure parts — parsing nvidia-smi's output, the device files and environment a container
needs, the allocator — are apart from the one function that runs a process
(:func:`discover_gpus`). GPUs are named by their nvidia-smi index, which is PCI bus order; the
environment sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA numbers them the same way (its
default order is fastest first).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

__all__ = [
    "QUERY_ARGS",
    "Gpu",
    "GpuAllocator",
    "GpuError",
    "device_paths",
    "discover_gpus",
    "minor_from_proc",
    "parse_nvidia_smi",
    "visible_devices_env",
]

log = structlog.get_logger(__name__)

#: The nvidia-smi arguments whose output :func:`parse_nvidia_smi` reads.
QUERY_ARGS = (
    "--query-gpu=index,uuid,name,pci.bus_id,memory.total",
    "--format=csv,noheader,nounits",
)
_PROC_GPUS = "/proc/driver/nvidia/gpus"
_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")


class GpuError(Exception):
    """A GPU request that cannot be met (not enough free, unknown or taken GPUs)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int  # nvidia-smi's index (PCI bus order)
    uuid: str  # GPU-xxxxxxxx-...
    name: str  # model, e.g. "NVIDIA A100-SXM4-40GB"
    minor: int  # N in /dev/nvidiaN
    memory_mib: int


def parse_nvidia_smi(text: str, minor_of: Callable[[str], int | None] | None = None) -> list[Gpu]:
    """The GPUs in the output of ``nvidia-smi`` with :data:`QUERY_ARGS`, by index.

    ``minor_of(pci_bus_id)`` gives a GPU's device minor when known (see
    :func:`minor_from_proc`); else the minor is the index. ValueError naming the line for a
    line that is not ``index, uuid, name, bus id, memory``.
    """
    gpus: list[Gpu] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            raise ValueError(f"nvidia-smi line {lineno}: want 5 fields, got {raw!r}")
        # The model name is the only field that could hold a comma.
        index_text, uuid, *name_parts, bus_id, memory_text = fields
        name = ", ".join(name_parts)
        try:
            index = int(index_text)
            memory = 0 if memory_text.strip("[]").upper() == "N/A" else int(memory_text)
        except ValueError:
            raise ValueError(
                f"nvidia-smi line {lineno}: index and memory must be integers, got {raw!r}"
            ) from None
        if index < 0 or memory < 0 or not uuid or not name:
            raise ValueError(f"nvidia-smi line {lineno}: bad GPU {raw!r}")
        known = minor_of(bus_id) if minor_of is not None else None
        gpus.append(Gpu(index, uuid, name, index if known is None else known, memory))
    gpus.sort(key=lambda g: g.index)
    if len({g.index for g in gpus}) != len(gpus):
        raise ValueError("nvidia-smi output lists a GPU index twice")
    return gpus


def minor_from_proc(bus_id: str, root: str = _PROC_GPUS) -> int | None:
    """The ``Device Minor`` the driver reports for the GPU at ``bus_id``, or None."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    # nvidia-smi writes an 8-digit PCI domain, the driver's directories a 4-digit one.
    path = os.path.join(root, f"{domain[-4:]}:{rest}", "information")
    try:
        with open(path) as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "Device Minor":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def discover_gpus(nvidia_smi: str | None = None, timeout: float = 5.0) -> list[Gpu]:
    """This machine's GPUs, from ``nvidia-smi`` (on PATH unless given); [] when there is none,
    or when it fails or hangs (with a warning)."""
    program = nvidia_smi or shutil.which("nvidia-smi")
    if program is None:
        return []
    try:
        code, out, err = _run(program, timeout)
    except subprocess.TimeoutExpired:
        log.warning("gpu_discovery_failed", program=program, error=f"no answer in {timeout}s")
        return []
    except (OSError, ValueError) as exc:  # not runnable; output not text
        log.warning("gpu_discovery_failed", program=program, error=str(exc))
        return []
    if code != 0:
        error = (err or out).strip()[:500]
        log.warning("gpu_discovery_failed", program=program, exit_code=code, error=error)
        return []
    try:
        return parse_nvidia_smi(out, minor_from_proc)
    except ValueError as exc:
        log.warning("gpu_discovery_failed", program=program, error=str(exc))
        return []


def _run(program: str, timeout: float) -> tuple[int, str, str]:
    """Run ``program`` with the query; on timeout kill its whole process group (a wrapper
    script's children too, which would otherwise hold the output pipes open)."""
    with subprocess.Popen(
        [program, *QUERY_ARGS],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return proc.returncode, out, err


def device_paths(gpus: Sequence[Gpu]) -> list[str]:
    """The device files a container using ``gpus`` needs: ``/dev/nvidia<minor>`` for each, then
    ``/dev/nvidiactl`` and ``/dev/nvidia-uvm``; none without GPUs. Pure: the caller allows in
    the devices cgroup those that exist."""
    if not gpus:
        return []
    return [f"/dev/nvidia{g.minor}" for g in sorted(gpus, key=lambda g: g.index)] + list(
        _CONTROL_DEVICES
    )


def visible_devices_env(gpus: Sequence[Gpu]) -> dict[str, str]:
    """The environment that shows a process exactly ``gpus``: ``"0,2"``; ``""`` for none."""
    indices = ",".join(str(g.index) for g in sorted(gpus, key=lambda g: g.index))
    return {
        "CUDA_VISIBLE_DEVICES": indices,
        "NVIDIA_VISIBLE_DEVICES": indices,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


class GpuAllocator:
    """Which GPUs each owner (a container) holds; each GPU by one owner at most. Pure."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self._gpus = {g.index: g for g in gpus}
        if len(self._gpus) != len(gpus):
            raise ValueError("two GPUs with the same index")
        self._owner_of: dict[int, str] = {}
        self._held: dict[str, tuple[Gpu, ...]] = {}

    @property
    def total(self) -> int:
        return len(self._gpus)

    @property
    def free(self) -> int:
        return len(self._gpus) - len(self._owner_of)

    def allocate(self, owner: str, count: int) -> tuple[Gpu, ...]:
        """Give ``owner`` ``count`` free GPUs, the lowest indices; GpuError if there are too few
        or ``owner`` holds GPUs already. ``count`` 0 gives none."""
        if count < 0:
            raise GpuError(f"cannot allocate {count} GPUs")
        if owner in self._held:
            raise GpuError(f"{owner} holds GPUs already")
        if count > self.free:
            raise GpuError(f"{owner} wants {count} GPUs, {self.free} of {self.total} are free")
        if count == 0:
            return ()
        chosen = tuple(self._gpus[i] for i in sorted(self._gpus) if i not in self._owner_of)
        return self._take(owner, chosen[:count])

    def release(self, owner: str) -> None:
        """Free what ``owner`` holds (nothing if it holds nothing)."""
        for gpu in self._held.pop(owner, ()):
            del self._owner_of[gpu.index]

    def restore(self, owner: str, indices: Sequence[int]) -> None:
        """Record again that ``owner`` holds the GPUs ``indices`` (an agent recovering its
        containers). GpuError for an unknown GPU or one another owner holds."""
        wanted = sorted(set(indices))
        unknown = [i for i in wanted if i not in self._gpus]
        if unknown:
            raise GpuError(f"{owner} held GPUs {unknown}, which this machine does not have")
        taken = [i for i in wanted if self._owner_of.get(i, owner) != owner]
        if taken:
            raise GpuError(f"{owner} held GPUs {taken}, which another owner holds")
        self.release(owner)
        if wanted:
            self._take(owner, tuple(self._gpus[i] for i in wanted))

    def held(self, owner: str) -> tuple[Gpu, ...]:
        return self._held.get(owner, ())

    def _take(self, owner: str, gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
        for gpu in gpus:
            self._owner_of[gpu.index] = owner
        self._held[owner] = gpus
        return gpus
