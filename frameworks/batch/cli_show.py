"""What ``agora batch status``, ``history`` and ``wait`` print: tables, progress, exit codes."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TextIO

from agora.frameworks.batch.client import BatchClient, Unreachable
from agora.frameworks.batch.parse import parse_when
from agora.frameworks.batch.records import TaskState
from agora.frameworks.batch.spec import SpecError
from agora.sdk.cli.common import CliError, duration
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = [
    "describe_end",
    "format_elapsed",
    "progress_line",
    "show_history",
    "show_job",
    "show_jobs",
    "tasks_summary",
    "wait_exit_code",
    "wait_job",
]

#: A job with more tasks than this shows counts, then only its tasks not COMPLETED.
MANY_TASKS: Final = 50
#: ``wait`` without a terminal prints a progress line at most this often (plus the last one).
LINE_EVERY: Final = 1.0
_ENDED: Final = tuple(s.value for s in TaskState if s.terminal)
_STYLE: Final = {
    "RUNNING": "green",
    "STARTING": "green",
    "COMPLETED": "blue",
    "FAILED": "red",
    "TIMEOUT": "red",
    "CANCELLED": "yellow",
}


def _console(file: TextIO | None = None) -> Console:
    console = Console(file=file)
    return console if console.is_terminal else Console(file=file, width=240)


def _dump(value: Any) -> None:
    print(json.dumps(value, indent=2))


# ------------------------------------------------------------------ formats


def format_elapsed(start: float | None, end: float | None, now: float) -> str:
    """Slurm's ``[D-]HH:MM:SS`` from ``start`` to ``end`` (or ``now``); "" before a start."""
    if start is None:
        return ""
    s = max(0, int((end if end is not None else now) - start))
    days, rest = divmod(s, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(timestamp))


def _mib(value: int | None) -> str:
    if value is None:
        return ""
    mib = value / (1 << 20)
    return f"{mib / 1024:.1f} GiB" if mib >= 10 * 1024 else f"{mib:.1f} MiB"


def _state(state: str) -> str:
    style = _STYLE.get(state)
    return f"[{style}]{state}[/{style}]" if style else state


def _counts(view: Mapping[str, Any]) -> Mapping[str, int]:
    counts: Mapping[str, int] = view.get("tasks") or {}
    return counts


def tasks_summary(counts: Mapping[str, int]) -> str:
    """``150/200 done, 10 running, 2 failed`` from a JobView's task counts."""
    ended = sum(counts.get(s, 0) for s in _ENDED)
    parts = [f"{ended}/{counts.get('total', 0)} done"]
    running = counts.get("RUNNING", 0) + counts.get("STARTING", 0)
    for n, word in (
        (running, "running"),
        (counts.get("FAILED", 0), "failed"),
        (counts.get("TIMEOUT", 0), "timed out"),
        (counts.get("CANCELLED", 0), "cancelled"),
    ):
        if n:
            parts.append(f"{n} {word}")
    return ", ".join(parts)


def progress_line(view: Mapping[str, Any]) -> str:
    """``job 12: 150/200 tasks ended (10 running)``."""
    counts = _counts(view)
    ended = sum(counts.get(s, 0) for s in _ENDED)
    running = counts.get("RUNNING", 0) + counts.get("STARTING", 0)
    return f"job {view['job_id']}: {ended}/{counts.get('total', 0)} tasks ended ({running} running)"


def describe_end(view: Mapping[str, Any]) -> str:
    """``job 12 COMPLETED``; ``job 12 FAILED (exit code 3): reason``."""
    text = f"job {view['job_id']} {view['state']}"
    if view["state"] == "FAILED" and view.get("exit_code"):
        text += f" (exit code {view['exit_code']})"
    return text + (f": {view['reason']}" if view.get("reason") else "")


def wait_exit_code(view: Mapping[str, Any]) -> int:
    """``agora batch wait``'s exit status for an ended job."""
    state, code = view["state"], view.get("exit_code")
    if state == "TIMEOUT":
        return 124
    if state == "CANCELLED":
        return 130
    if state == "COMPLETED":
        return 0
    if not isinstance(code, int) or code == 0:
        return 1
    if code < 0:  # killed by a signal
        return min(128 - code, 255)
    return code if code <= 255 else 1


# ------------------------------------------------------------------ status


def show_jobs(jobs: Sequence[Mapping[str, Any]], *, as_json: bool, everything: bool) -> int:
    if as_json:
        _dump({"jobs": list(jobs)})
        return 0
    now = time.time()
    title = "Jobs" if everything else "Jobs (not ended or ended lately; --all shows every one)"
    table = Table(title=f"{title} ({len(jobs)})", title_justify="left")
    for name in ("JOB", "NAME", "USER", "QUEUE", "PRI", "STATE", "TASKS", "SUBMITTED", "ELAPSED"):
        table.add_column(name, overflow="fold", no_wrap=name in ("JOB", "SUBMITTED", "ELAPSED"))
    for job in jobs:
        table.add_row(
            str(job["job_id"]),
            escape(str(job["name"])),
            escape(str(job["user"])),
            escape(str(job["queue"])),
            str(job["priority"]),
            _state(str(job["state"])),
            tasks_summary(_counts(job)),
            duration(now - float(job["submit_time"])) + " ago",
            format_elapsed(job.get("start_time"), job.get("end_time"), now),
        )
    _console().print(table)
    return 0


def show_job(answer: Mapping[str, Any], *, as_json: bool) -> int:
    if as_json:
        _dump(answer)
        return 0
    job, tasks = answer["job"], list(answer.get("tasks") or [])
    now = time.time()
    console = _console()
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    state = _state(str(job["state"])) + (f" ({escape(job['reason'])})" if job["reason"] else "")
    rows = [
        ("job", f"{job['job_id']}  {escape(str(job['name']))}"),
        ("user", escape(str(job["user"]))),
        ("queue", f"{escape(str(job['queue']))}  priority {job['priority']}"),
        ("state", state),
        ("submitted", f"{_when(job['submit_time'])} ({duration(now - job['submit_time'])} ago)"),
        ("started", _when(job.get("start_time"))),
        ("ended", _when(job.get("end_time"))),
        ("elapsed", format_elapsed(job.get("start_time"), job.get("end_time"), now)),
        ("exit code", "" if job.get("exit_code") is None else str(job["exit_code"])),
        ("array", str(job.get("array") or "")),
        ("ntasks", str(job["ntasks"]) if job.get("ntasks", 1) > 1 else ""),
        ("dependencies", ",".join(job.get("dependencies") or [])),
        ("tasks", tasks_summary(_counts(job))),
    ]
    for key, value in rows:
        if value:
            fields.add_row(key, value)
    console.print(fields)
    title = "Tasks"
    if len(tasks) > MANY_TASKS:
        counts = _counts(job)
        console.print(
            "  ".join(f"{s.value} {counts.get(s.value, 0)}" for s in TaskState), highlight=False
        )
        tasks = [t for t in tasks if t["state"] != "COMPLETED"]
        title = "Tasks not COMPLETED"
    if tasks:
        console.print(_tasks_table(tasks, title, now))
    return 0


def _tasks_table(tasks: Sequence[Mapping[str, Any]], title: str, now: float) -> Table:
    table = Table(title=f"{title} ({len(tasks)})", title_justify="left")
    # PREEMPTED (how many of its attempts were) only when some task was: rare, and then telling.
    preempted = any(t.get("preemptions") for t in tasks)
    names = ("TASK", "STATE", "ATTEMPT", "PREEMPTED", "EXIT", "HOST", "START", "ELAPSED", "REASON")
    for name in names:
        if name != "PREEMPTED" or preempted:
            table.add_column(name, overflow="fold", no_wrap=name in ("TASK", "START", "ELAPSED"))
    for t in tasks:
        table.add_row(
            f"{t['job_id']}.{t['index']}",
            _state(str(t["state"])),
            str(t["attempt"]),
            *([str(t.get("preemptions") or 0)] if preempted else []),
            "" if t.get("exit_code") is None else str(t["exit_code"]),
            escape(str(t.get("hostname") or "")),
            _when(t.get("start_time")),
            format_elapsed(t.get("start_time"), t.get("end_time"), now),
            escape(str(t.get("reason") or "")),
        )
    return table


# ------------------------------------------------------------------ history


def show_history(
    client: BatchClient,
    *,
    user: str | None,
    since: str | None,
    job_id: int | None,
    limit: int | None,
    as_json: bool,
) -> int:
    try:
        start = None if since is None else parse_when(since, time.time())
    except SpecError as exc:
        raise CliError(str(exc), code=2) from None
    records = client.history(user=user, since=start, job_id=job_id, limit=limit)
    if as_json:
        _dump({"records": records})
        return 0
    table = Table(title=f"Ended tasks ({len(records)})", title_justify="left")
    for name in ("JOBID", "NAME", "USER", "STATE", "EXIT", "START", "END", "ELAPSED", "AGENT"):
        table.add_column(name, overflow="fold", no_wrap=name in ("JOBID", "START", "END"))
    table.add_column("CPU (s)", justify="right")
    table.add_column("MAXRSS", justify="right")
    for r in records:
        cpu = r.get("cpu_seconds")
        table.add_row(
            f"{r['job_id']}.{r['index']}",
            escape(str(r.get("name", ""))),
            escape(str(r.get("user", ""))),
            _state(str(r["state"])),
            "" if r.get("exit_code") is None else str(r["exit_code"]),
            _when(r.get("start_time")),
            _when(r.get("end_time")),
            format_elapsed(r.get("start_time"), r.get("end_time"), time.time()),
            escape(str(r.get("hostname") or "")),
            "" if cpu is None else f"{cpu:.1f}",
            _mib(r.get("max_rss_bytes")),
        )
    _console().print(table)
    return 0


# ------------------------------------------------------------------ wait


def wait_job(
    client: BatchClient,
    job_id: int,
    *,
    interval: float,
    as_json: bool,
    patience: float,
    err: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll the job until it ends, showing progress on ``err`` (a bar on a terminal, else a
    line per change, at most one a second); its exit status (:func:`wait_exit_code`). Once it has
    answered, the service may be unreachable for up to ``patience`` seconds at a time (a
    restart)."""
    stream = sys.stderr if err is None else err
    bar: Progress | None = None
    if stream.isatty():
        bar = Progress(
            TextColumn(f"job {job_id}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tasks ended, {task.fields[running]} running"),
            TimeElapsedColumn(),
            console=Console(file=stream),
        )
        bar.start()
    bar_task = None if bar is None else bar.add_task("", total=None, running=0)
    last_ok: float | None = None  # unreachable before the first answer: fail at once
    last_line, last_printed = "", float("-inf")
    try:
        while True:
            try:
                view = client.job(job_id, tasks=False)["job"]
            except Unreachable:
                if last_ok is None or clock() - last_ok > patience:
                    raise
                sleep(interval)
                continue
            last_ok = clock()
            ended = bool(view["state"] not in ("PENDING", "RUNNING"))
            if bar is not None and bar_task is not None:
                counts = _counts(view)
                bar.update(
                    bar_task,
                    total=counts.get("total", 0),
                    completed=sum(counts.get(s, 0) for s in _ENDED),
                    running=counts.get("RUNNING", 0) + counts.get("STARTING", 0),
                )
            else:
                line = progress_line(view)
                if line != last_line and (ended or clock() - last_printed >= LINE_EVERY):
                    print(line, file=stream, flush=True)
                    last_line, last_printed = line, clock()
            if ended:
                break
            sleep(interval)
    finally:
        if bar is not None:
            bar.stop()
    print(describe_end(view), file=stream, flush=True)
    if as_json:
        _dump(view)
    return wait_exit_code(view)
