"""``agora batch ...``: submit, watch and cancel batch jobs (added to ``agora`` by entry point).

The commands talk to the batch service's HTTP API (:mod:`agora.frameworks.batch.client`);
``logs`` also asks the master which agent to read from, and ``serve`` runs the service itself.
The tables and ``wait`` live in :mod:`agora.frameworks.batch.cli_show`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import sys
from typing import Any

from agora.frameworks.batch.cli_show import show_history, show_job, show_jobs, wait_job
from agora.frameworks.batch.client import BatchClient
from agora.frameworks.batch.parse import add_submit_options, build_spec
from agora.frameworks.batch.spec import SpecError
from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    positive_float,
    resolve_curve,
    resolve_master,
)
from agora.sdk.cli.logs import print_task_output

__all__ = ["add_parser", "job_ref"]

_DESCRIPTION = """\
A job queue on the cluster, in the manner of Slurm: submit commands or job scripts (arrays, gangs,
dependencies, time limits, retries), watch them, wait for them, read their output and accounting.

The batch service is found from --batch URL, else $AGORA_BATCH, else $AGORA_HOME/batch (written by
the service when it starts: `agora batch serve`, or `agora local`).

examples:
  agora batch submit -c 2 --mem 4G -- python train.py --epochs 3
  agora batch submit --array 0-99%10 job.sh      # job.sh may hold #AGORA lines with options
  agora batch submit -d afterok:12 -t 1:00:00 -- sh -c 'make && ./test'
  agora batch status                             # the queue; `status 12` for one job
  agora batch wait 12                            # exits with the job's exit code
  agora batch logs --follow 12.3                 # task 3's stdout
  agora batch history --since 2h
"""

_SUBMIT_DESCRIPTION = """\
Queue a job: a command after --, or a job script (a file) and its arguments. The command's words
are joined with shlex.join and run by /bin/sh -c, each one argument, exactly as typed; for shell
syntax say so: -- sh -c 'echo $HOME | wc -c'.

A script's header may hold options, one or more per line, like #SBATCH:
  #!/bin/sh
  #AGORA --cpus 2 --mem 4G
  #AGORA -a 0-99%10
Options on the command line win over the script's (--env adds to them, by name).
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    batch = sub.add_parser(
        "batch",
        help="a job queue: submit, status, wait, cancel, logs, history (like Slurm)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = batch.add_subparsers(dest="batch_command", metavar="COMMAND", required=True)

    submit = cmds.add_parser(
        "submit",
        help="queue a command or a job script",
        description=_SUBMIT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_submit_options(submit)
    _service_options(submit)
    submit.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ... | SCRIPT [ARGS ...]")
    submit.set_defaults(func=cmd_submit)

    status = cmds.add_parser("status", help="the queue, or one job and its tasks")
    status.add_argument("job", nargs="?", type=_job_id, metavar="JOB")
    status.add_argument("--all", action="store_true", help="include jobs that ended long ago")
    status.add_argument("--user", help="only this user's jobs")
    status.add_argument("--limit", type=_count, metavar="N", help="at most N jobs")
    _service_options(status)
    status.set_defaults(func=cmd_status)

    cancel = cmds.add_parser("cancel", help="cancel a job, or one task of it (JOB.IDX)")
    cancel.add_argument("job", type=job_ref, metavar="JOB[.IDX]")
    _service_options(cancel)
    cancel.set_defaults(func=cmd_cancel)

    wait = cmds.add_parser(
        "wait",
        help="wait for a job to end; exit with its exit code",
        description="Wait for a job to end, showing its progress on stderr. Exit status: the "
        "job's exit code when COMPLETED or FAILED, 124 for TIMEOUT, 130 for CANCELLED.",
    )
    wait.add_argument("job", type=_job_id, metavar="JOB")
    wait.add_argument(
        "--interval", type=positive_float, default=0.5, metavar="S", help="poll every S seconds"
    )
    _service_options(wait)
    wait.set_defaults(func=cmd_wait)

    logs = cmds.add_parser(
        "logs",
        help="print a task's stdout or stderr",
        description="Print a task's stdout (or --stderr), read through the agent it ran on. JOB "
        "alone names a job of one task; else name the task as JOB.IDX.",
    )
    logs.add_argument("job", type=job_ref, metavar="JOB[.IDX]")
    logs.add_argument("--stderr", action="store_true", help="the task's stderr, not its stdout")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new output until the task ends"
    )
    logs.add_argument(
        "--batch", metavar="ADDRESS", help="the batch service (default: $AGORA_BATCH)"
    )
    add_master_options(logs)
    logs.set_defaults(func=cmd_logs)

    history = cmds.add_parser("history", help="accounting of ended tasks (like sacct)")
    history.add_argument("--user", help="only this user's tasks")
    history.add_argument(
        "--since",
        metavar="WHEN",
        help="tasks that ended since WHEN: unix seconds, 2026-12-03[T10:00], or an age (2h, 30m)",
    )
    history.add_argument("--job", type=_job_id, metavar="J", help="only job J's tasks")
    history.add_argument("--limit", type=_count, metavar="N", help="at most N records")
    _service_options(history)
    history.set_defaults(func=cmd_history)

    # Every word after `serve` is the service's (prefix_chars that no argument uses).
    serve = cmds.add_parser(
        "serve",
        help="run the batch service (its options: agora batch serve --help)",
        add_help=False,
        prefix_chars="\0",
    )
    serve.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGS")
    serve.set_defaults(func=cmd_serve)


def _service_options(parser: argparse.ArgumentParser, json_flag: bool = True) -> None:
    parser.add_argument(
        "--batch",
        metavar="ADDRESS",
        help="the batch service: a URL, or unix:PATH for its Unix socket (default: "
        "$AGORA_BATCH, else $AGORA_HOME/batch.sock, else the URL in $AGORA_HOME/batch)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="give up on the batch service after S seconds (default 10)",
    )
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print the service's JSON")


def job_ref(text: str) -> tuple[int, int | None]:
    """argparse type: ``12`` -> (12, None); ``12.3`` (or Slurm's ``12_3``) -> (12, 3)."""
    match = re.fullmatch(r"\s*(\d+)(?:[._](\d+))?\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected JOB or JOB.IDX (12 or 12.3), not {text!r}")
    return int(match[1]), None if match[2] is None else int(match[2])


def _job_id(text: str) -> int:
    job, index = job_ref(text)
    if index is not None:
        raise argparse.ArgumentTypeError(f"expected a job id (e.g. 12), not {text!r}")
    return job


def _count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {text!r}")
    return int(text)


def _client(args: argparse.Namespace) -> BatchClient:
    return BatchClient(args.batch, timeout=args.timeout)


def _dump(value: Any) -> None:
    print(json.dumps(value, indent=2))


# ------------------------------------------------------------------ commands


def cmd_submit(args: argparse.Namespace) -> int:
    words: list[str] = list(args.argv)
    script_path: str | None = None
    script_text: str | None = None
    command: list[str] = []
    if words[:1] == ["--"]:
        command = words[1:]
        if not command:
            raise CliError("no command after --", code=2)
    elif not words:
        raise CliError(
            "nothing to run: agora batch submit [options] -- CMD ..., or [options] SCRIPT [ARGS]",
            code=2,
        )
    elif os.path.isfile(words[0]):
        script_path = words[0]
        try:
            with open(script_path, encoding="utf-8") as file:
                script_text = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read the job script {script_path}: {exc}") from None
    else:
        raise CliError(
            f"{words[0]} is not a file; to run a command, put it after --: "
            f"agora batch submit [options] -- {shlex.join(words)}",
            code=2,
        )
    try:
        spec = build_spec(
            args,
            command_words=command,
            script_path=script_path,
            script_text=script_text,
            script_args=words[1:] if script_path else (),
        )
    except SpecError as exc:
        raise CliError(str(exc)) from None
    answer = _client(args).submit(spec)
    if args.json:
        _dump(answer)
    else:
        print(f"Submitted batch job {answer['job_id']}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.job is not None:
        return show_job(client.job(args.job), as_json=args.json)
    return show_jobs(
        client.jobs(all=args.all, user=args.user, limit=args.limit),
        as_json=args.json,
        everything=args.all,
    )


def cmd_cancel(args: argparse.Namespace) -> int:
    job_id, index = args.job
    cancelled = _client(args).cancel(job_id, index)
    if args.json:
        _dump({"cancelled": cancelled})
    else:
        print(f"cancelled {cancelled} task(s) of job {job_id}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    return wait_job(
        _client(args),
        args.job,
        interval=args.interval,
        as_json=args.json,
        patience=args.timeout,
    )


def cmd_history(args: argparse.Namespace) -> int:
    return show_history(
        _client(args),
        user=args.user,
        since=args.since,
        job_id=args.job,
        limit=args.limit,
        as_json=args.json,
    )


def cmd_logs(args: argparse.Namespace) -> int:
    job_id, index = args.job
    client = BatchClient(args.batch, timeout=args.timeout)
    if index is None:
        total = int(client.job(job_id, tasks=False)["job"]["tasks"]["total"])
        tasks = client.job(job_id)["tasks"] if total == 1 else []
        if total != 1 or not tasks:
            raise CliError(f"job {job_id} has {total} tasks: name one as {job_id}.IDX")
        index = int(tasks[0]["index"])
    answer = client.task(job_id, index)
    task = answer["task"]
    if not task.get("task_id") or not task.get("agent_id"):
        raise CliError(f"task {job_id}.{index} has not started")
    work = print_task_output(
        resolve_master(args),
        resolve_curve(args),
        args.timeout,
        str(task["task_id"]),
        str(answer.get("framework_id") or "") or None,
        str(task["agent_id"]),
        "stderr" if args.stderr else "stdout",
        args.follow,
    )
    try:
        return asyncio.run(work)
    except KeyboardInterrupt:
        if args.follow:
            return 0
        raise


def cmd_serve(args: argparse.Namespace) -> int:
    from agora.frameworks.batch.__main__ import main as serve

    argv: list[str] = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    sys.stdout.flush()
    code: int = serve(argv)
    return code
