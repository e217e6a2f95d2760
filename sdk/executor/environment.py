"""What the agent tells an executor process through its environment (the AGORA_* variables).

:meth:`ExecutorEnvironment.from_environ` reads the mapping it is given (and the working directory
when AGORA_SANDBOX is unset); nothing else here touches the process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID

__all__ = [
    "DEFAULT_RECOVERY_TIMEOUT",
    "DEFAULT_SHUTDOWN_GRACE_PERIOD",
    "EXECUTOR_ENV_VARS",
    "ExecutorEnvironment",
]

DEFAULT_RECOVERY_TIMEOUT: Final = 900.0
DEFAULT_SHUTDOWN_GRACE_PERIOD: Final = 5.0
#: The variables the agent sets for an executor process (a command executor hides them from tasks).
EXECUTOR_ENV_VARS: Final = (
    "AGORA_AGENT_ENDPOINT",
    "AGORA_FRAMEWORK_ID",
    "AGORA_EXECUTOR_ID",
    "AGORA_AGENT_ID",
    "AGORA_SANDBOX",
    "AGORA_SHUTDOWN_GRACE_PERIOD",
    "AGORA_RECOVERY_TIMEOUT",
    "AGORA_EXECUTOR_SECRET",
)


@dataclass(frozen=True, slots=True)
class ExecutorEnvironment:
    """What the agent tells an executor process through its environment."""

    agent_endpoint: str
    framework_id: FrameworkID
    executor_id: ExecutorID
    sandbox: str
    agent_id: AgentID | None = None
    shutdown_grace_period: float = DEFAULT_SHUTDOWN_GRACE_PERIOD
    recovery_timeout: float = DEFAULT_RECOVERY_TIMEOUT
    #: The agent's secret for this executor, sent with every (re-)registration ("": none given).
    secret: str = field(default="", repr=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ExecutorEnvironment:
        """Read the AGORA_* variables; raises ValueError naming a missing or bad one."""

        def required(name: str) -> str:
            value = environ.get(name, "")
            if not value:
                raise ValueError(f"{name} is not set (the agent sets it for every executor)")
            return value

        def seconds(name: str, default: float) -> float:
            text = environ.get(name, "")
            if not text:
                return default
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {text!r}")
            return value

        agent_id = environ.get("AGORA_AGENT_ID", "")
        return cls(
            agent_endpoint=required("AGORA_AGENT_ENDPOINT"),
            framework_id=FrameworkID(required("AGORA_FRAMEWORK_ID")),
            executor_id=ExecutorID(required("AGORA_EXECUTOR_ID")),
            sandbox=environ.get("AGORA_SANDBOX") or os.getcwd(),
            agent_id=AgentID(agent_id) if agent_id else None,
            shutdown_grace_period=seconds(
                "AGORA_SHUTDOWN_GRACE_PERIOD", DEFAULT_SHUTDOWN_GRACE_PERIOD
            ),
            recovery_timeout=seconds("AGORA_RECOVERY_TIMEOUT", DEFAULT_RECOVERY_TIMEOUT),
            secret=environ.get("AGORA_EXECUTOR_SECRET", ""),
        )
