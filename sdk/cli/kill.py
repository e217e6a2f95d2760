"""``agora kill TASK_ID``: kill a task as an operator (as if its framework had asked)."""

from __future__ import annotations

import argparse

from agora.sdk.cli.common import add_master_options, call_master, resolve_curve, resolve_master
from agora.sdk.ids import FrameworkID, TaskID

__all__ = ["add_parser", "cmd_kill"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kill = sub.add_parser(
        "kill",
        help="kill a task (operator call)",
        description="Ask the master to kill a task, as if its framework had asked. Exits 1 with "
        "the master's message when it refuses (unknown task, ambiguous id...).",
    )
    kill.add_argument("task_id", metavar="TASK_ID")
    kill.add_argument(
        "--framework",
        metavar="ID",
        help="the task's framework, when several frameworks have a task with this id",
    )
    add_master_options(kill)
    kill.set_defaults(func=cmd_kill)


def cmd_kill(args: argparse.Namespace) -> int:
    timeout: float = args.timeout
    task_id = TaskID(args.task_id)
    framework_id = FrameworkID(args.framework) if args.framework else None
    curve = resolve_curve(args)
    call_master(
        resolve_master(args),
        timeout,
        lambda c: c.kill(task_id, framework_id, timeout=timeout),
        curve,
    )
    print(f"kill requested for task {task_id}")
    return 0
