"""The ``agora`` command line: a local cluster, one-off tasks, and the operator's view.

``agora local`` starts a master and agents as child processes; ``agora run`` is a one-task
framework (like ``mesos-execute``); ``agora state|agents|tasks`` show the master's state and
``agora kill`` kills a task; ``agora keys generate`` makes CURVE keys. The CLI talks to daemons
over the wire only, never importing them.
"""

from __future__ import annotations

from agora.sdk.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
