"""The batch framework's own cost per task, without a cluster: its core and its durable job store.

In one process: one array job of ``--tasks`` tasks is stored (fsynced), offers from two agents
are matched (one launch of every task), then each task's RUNNING and FINISHED updates arrive in
bursts of ``--burst`` and every burst is one group commit (one transaction, one fsync), as the
service commits them. The store goes on disk (a temp dir under ``--store-dir``) unless told
otherwise. What ``tests/bench/batch.py`` measures on top of this is the SDK driver, the master,
the agents and the executors.

Prints one JSON line: tasks, seconds (submission to the last commit), tasks_per_s, commits, and
how the seconds split between submit, offers (matching) and updates (status handling and commits).

    python tests/bench/batch_core.py --tasks 5000 --burst 100
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.spec import ArraySpec, JobSpec
from agora.frameworks.batch.store import JobStore
from agora.sdk.ids import AgentID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import Offer, StatusSource, TaskStatus
from agora.sdk.messages import TaskState as S
from agora.sdk.resources import Resources


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--burst", type=int, default=100, help="updates per group commit")
    parser.add_argument("--store-dir", help="where the job store goes (default: a disk temp dir)")
    args = parser.parse_args()
    spec = JobSpec(
        name="bench",
        user="bench",
        command="true",
        cpus=0.01,
        mem=1,
        array=ArraySpec(((0, args.tasks - 1, 1),)),
    )
    with tempfile.TemporaryDirectory(prefix="agora-bench-core-", dir=args.store_dir) as disk:
        store = JobStore.open(Path(disk) / "jobs.sqlite")
        core = BatchCore(CoreConfig())
        commits = 0

        def commit(now: float) -> None:
            nonlocal commits
            jobs, tasks = core.take_dirty()
            store.save(jobs, tasks, core.fairshare.take_changed(now))
            commits += 1

        try:
            start = time.perf_counter()
            job, tasks = store.add_job(spec, time.time())
            core.add_job(job, tasks, time.time())
            submitted = time.perf_counter()
            per_agent = f"cpus:{args.tasks};mem:{args.tasks * 2};disk:1024"
            offers = [
                Offer(
                    offer_id=OfferID(f"o{n}"),
                    framework_id=FrameworkID("fw"),
                    agent_id=AgentID(f"a{n}"),
                    hostname=f"host{n}",
                    role="*",
                    resources=Resources.parse(per_agent),
                )
                for n in range(2)
            ]
            core.offers(offers, time.time())
            commit(time.time())
            matched = time.perf_counter()
            running = [(TaskID(t.task_id), AgentID(t.agent_id)) for t in core.active.values()]
            for state in (S.RUNNING, S.FINISHED):
                for first in range(0, len(running), args.burst):
                    for n, (task_id, agent_id) in enumerate(running[first : first + args.burst]):
                        status = TaskStatus(
                            task_id=task_id,
                            state=state,
                            source=StatusSource.EXECUTOR,
                            agent_id=agent_id,
                            uuid=n.to_bytes(16, "big"),
                            exit_code=0 if state is S.FINISHED else None,
                        )
                        core.status(status, time.time())
                    commit(time.time())
            done = time.perf_counter()
            ended = store.task_counts(job.job_id)["COMPLETED"]
        finally:
            store.close()
    seconds = done - start
    result = {
        "tasks": args.tasks,
        "burst": args.burst,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(args.tasks / seconds, 1),
        "commits": commits + 1,  # and the submission's
        "completed": ended,
        "split_s": {
            "submit": round(submitted - start, 3),
            "offers": round(matched - submitted, 3),
            "updates": round(done - matched, 3),
        },
    }
    print(json.dumps(result))
    return 0 if ended == args.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
