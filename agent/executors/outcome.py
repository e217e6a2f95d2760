"""What a command task's terminal update says of how its process ended.

Exit statuses follow the shell's convention whatever the isolation: the exit code, or 128+N for
a process killed by signal N (143 for SIGTERM, 137 for SIGKILL), as ``agora run`` exits. A
killed task's message also says whether it exited within its kill grace period or was
SIGKILLed when the grace period ran out.
"""

from __future__ import annotations

import signal

__all__ = ["exit_message", "kill_message"]


def exit_message(returncode: int | None) -> str:
    """``returncode`` as subprocess gives it (negative: killed by that signal), in words."""
    if returncode is None:
        return "Command exit status unknown"
    if returncode >= 0:
        return f"Command exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"Command terminated by signal {name} (exit status {128 - returncode})"


def kill_message(returncode: int | None, grace: float | None, escalated: bool) -> str:
    """The message of a KILLED task: how it exited, and whether within its grace period.

    ``grace``: the grace period the kill gave (None: unknown); ``escalated``: some of the task
    was still running when it ran out, and was SIGKILLed.
    """
    if grace is None:
        return exit_message(returncode)
    period = f"its {grace:g} s kill grace period" if grace > 0 else "no kill grace period"
    if escalated:
        if grace > 0:
            return f"{exit_message(returncode)}; SIGKILLed: still running when {period} ran out"
        return f"{exit_message(returncode)}; SIGKILLed at once ({period})"
    return f"{exit_message(returncode)} within {period}"
