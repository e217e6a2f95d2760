"""Executor authentication: an executor proves it is the process the agent launched.

When the core launches an executor it draws a fresh secret for it (from the source the shell
injected, ``Agent(new_secret=...)``) and puts it in the executor's environment as
AGORA_EXECUTOR_SECRET. The secret is checkpointed with the executor, so an agent restarted from
its checkpoint still knows it and re-adopts the executor. REGISTER_EXECUTOR and
REREGISTER_EXECUTOR must carry it: one with a missing or wrong secret is refused (an
``ExecutorRefused`` action, which the shell logs) and changes nothing, so a stranger on the host
who read the ids from the agent's /state cannot move the executor's peer to itself, nor reach
its tasks. Every other executor message is taken only from the peer that registered, so the
secret guards the whole session.

An executor recovered from a checkpoint written before executors had secrets has none; it is
re-adopted as before (it could not know a secret).
"""

from __future__ import annotations

import hmac
import secrets

from agora.agent.core.state import Executor

__all__ = ["SECRET_ENV", "random_secret", "refusal"]

#: The environment variable that carries an executor's secret.
SECRET_ENV = "AGORA_EXECUTOR_SECRET"


def random_secret() -> str:
    """A fresh executor secret: 32 random bytes, URL-safe text (43 characters)."""
    return secrets.token_urlsafe(32)


def refusal(ex: Executor | None, secret: str) -> str | None:
    """Why a registration claiming ``ex`` with ``secret`` is refused, or None if it may go on
    (an unknown executor is the registration handlers' business)."""
    if ex is None or not ex.secret:
        return None
    if not secret:
        return "missing secret"
    if not hmac.compare_digest(secret.encode(), ex.secret.encode()):
        return "wrong secret"
    return None
