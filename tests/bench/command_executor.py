"""Command-executor throughput: N trivial tasks through one real executor and a fake agent.

    .venv/bin/python tests/bench/command_executor.py [--tasks 2000] [--command true] [--window 0]

Prints JSON: tasks/s from the first LAUNCH_TASK to the last terminal update, the executor's own
CPU time per task (user+sys from /proc) and its task processes' CPU time per task. ``--window``
bounds the tasks in flight (0 = launch all at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agora.sdk.messages import LaunchTask, ShutdownExecutor, is_terminal
from support.executor_kit import (
    EXECUTOR_ID,
    FRAMEWORK_ID,
    ExecutorProcess,
    FakeAgent,
    cleanup,
    task,
)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own user+sys, reaped children's user+sys) of ``pid`` in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / tick
    children = (int(fields[13]) + int(fields[14])) / tick
    return own, children


async def bench(n: int, command: str, window: int, work_dir: str | None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        root = Path(tmp)
        agent = FakeAgent.start()
        executor = ExecutorProcess.start(root, agent.endpoint, env={"AGORA_LOG_LEVEL": "info"})
        try:
            await agent.wait_for(lambda: agent.peer, timeout=30)

            finished = agent.finished_count

            own0, kids0 = cpu_seconds(executor.popen.pid)
            start = time.perf_counter()
            launched = 0
            while launched < n:
                limit = n if window <= 0 else min(n, finished() + window)
                while launched < limit:
                    await agent.send(
                        LaunchTask(framework_id=FRAMEWORK_ID, task=task(f"t{launched}", command))
                    )
                    launched += 1
                if launched < n:
                    await agent.wait_for(
                        lambda target=launched: finished() + window > target, timeout=60
                    )
            await agent.wait_for(lambda: finished() >= n, timeout=120)
            elapsed = time.perf_counter() - start
            own1, kids1 = cpu_seconds(executor.popen.pid)
            failed = [s for s in agent.statuses() if is_terminal(s.state) and s.exit_code != 0]
            await agent.send(ShutdownExecutor(framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID))
            await executor.wait(30)
            return {
                "tasks": n,
                "command": command,
                "window": window,
                "work_dir": str(root.parent),
                "seconds": round(elapsed, 3),
                "tasks_per_second": round(n / elapsed, 1),
                "executor_cpu_us_per_task": round((own1 - own0) / n * 1e6, 1),
                "task_cpu_us_per_task": round((kids1 - kids0) / n * 1e6, 1),
                "failed": len(failed),
            }
        finally:
            cleanup(root, executor)
            await agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--command", default="true")
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument(
        "--work-dir", default=None, help="parent of the sandboxes (e.g. /dev/shm); default: $TMPDIR"
    )
    args = parser.parse_args()
    result = asyncio.run(bench(args.tasks, args.command, args.window, args.work_dir))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
