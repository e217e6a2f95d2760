"""``agora run``'s output relay: streamed chunks in order, and what a failover lost read back.

The command executor streams a task's output as framework messages, which are best effort: a chunk
sent while the leading master fails over is gone. Each chunk says where it starts in its stream, so
:class:`OutputRelay` writes only what continues what it wrote and notices a gap; :func:`read_rest`
then reads what is missing from the task's sandbox through its agent's HTTP API, and relaying goes
on from there. Once the task has ended the sandbox is read once more if a gap is still open or the
scheduler re-subscribed meanwhile (a lost last chunk leaves no gap behind it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agora.sdk.cli.common import CliError, ask_master
from agora.sdk.executor.output import OUTPUT_STREAMS
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.transport import CurveClient

__all__ = ["OutputRelay", "read_rest"]


@dataclass(slots=True)
class OutputRelay:
    """What of each stream was written, and which streams lost a chunk on the way (pure)."""

    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTPUT_STREAMS, 0))
    gaps: set[str] = field(default_factory=set)
    #: The scheduler re-subscribed (a master failed over): chunks may have been lost.
    resubscribed: bool = False

    def chunk(self, stream: str, data: bytes, offset: int | None) -> bytes:
        """What of a chunk starting at ``offset`` to write now (b"" for none: written already,
        or beyond a gap that the sandbox must fill first)."""
        if offset is None:  # an agent that does not number its chunks: relay as they come
            self.written[stream] += len(data)
            return data
        done = self.written[stream]
        if offset > done:
            self.gaps.add(stream)
            return b""
        fresh = data[done - offset :]
        self.written[stream] = max(done, offset + len(data))
        return fresh

    def filled(self, stream: str, data: bytes, start: int, end: int) -> bytes:
        """``data``, bytes ``start`` to ``end`` of the stream read from the sandbox: what of it
        to write (chunks relayed meanwhile may have written part of it)."""
        done = self.written[stream]
        if end <= done:
            return b""
        self.written[stream] = end
        return data[max(0, done - start) :]

    @property
    def incomplete(self) -> bool:
        """Whether the sandbox may hold output that was not written."""
        return bool(self.gaps) or self.resubscribed


async def read_rest(
    relay: OutputRelay,
    write: Callable[[str, bytes], object],
    master: str,
    curve: CurveClient | None,
    timeout: float,
    framework_id: FrameworkID | None,
    agent_id: AgentID,
    task_id: TaskID,
) -> None:
    """Write, through ``write(stream, data)``, what the relay has not written of each stream,
    read from the task's sandbox on its agent as it is now; the gaps it fills are closed.
    CliError when the master or the agent cannot say."""
    # Only after a failover: the HTTP client stays out of every other `agora run`.
    from agora.sdk.cli.logs import SandboxNotFound, agent_url, read_sandbox_file

    state = await ask_master(master, timeout, lambda c: c.get_state(timeout=timeout), curve)
    agent = next((a for a in state.agents if a.agent_id == agent_id), None)
    if agent is None:
        raise CliError(f"the master no longer knows the task's agent {agent_id}")
    base = agent_url(agent)
    framework = str(framework_id) if framework_id is not None else None
    for stream in OUTPUT_STREAMS:
        relay.gaps.discard(stream)  # a chunk lost from here on opens a new one
        start = relay.written[stream]
        try:
            reading = read_sandbox_file(base, task_id, framework, stream, start, timeout)
            async for text, end in reading:
                write(stream, relay.filled(stream, text.encode(), start, end))
                start = end
        except SandboxNotFound:
            pass  # the command executor writes both files; none: nothing was written
