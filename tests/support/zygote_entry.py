"""What a test's zygote runs instead of the command executor: a report of what it became."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    with open("/proc/self/environ", "rb") as f:
        proc_environ = [e.decode() for e in f.read().split(b"\0") if e]
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().split(b"\0") if a]
    report = {
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "session_leader": os.getsid(0) == os.getpid(),
        "environ": dict(os.environ),
        "proc_environ": proc_environ,
        "cmdline": cmdline,
        "stdin": sys.stdin.read(),
        "ppid": os.getppid(),
    }
    with open("report.json", "w", encoding="utf-8") as f:
        json.dump(report, f)
    print("hello from the executor")
    if os.environ.get("ZYGOTE_TEST_CRASH"):
        raise RuntimeError("the executor crashed")
    sys.exit(7)
