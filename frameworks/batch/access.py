"""Who may do what with the batch service's jobs: pure rules over an identified caller.

A caller comes in one of two ways. Over the service's Unix socket the kernel names them
(SO_PEERCRED): a local Unix user, whose jobs run as themself; root (uid 0) is the operator and
may name any user. Over TCP a caller shows a bearer token from ``--http-credentials``: a token
holder is an operator (it may submit as any user, read and cancel every job), so tokens are given
only to operators and to tools acting for them. A service started ``--insecure-http`` treats an
anonymous TCP caller the same way.

A job belongs to the user it runs as (its spec's ``user``) and to whoever submitted it (their
uid); a caller who is not an operator sees and cancels only the jobs that belong to them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Caller", "list_filter", "may_access", "submit_problem"]


@dataclass(frozen=True, slots=True)
class Caller:
    """An identified caller: a local Unix user (``uid``, ``login``) over the Unix socket, or a
    token's ``principal`` over TCP (``principal`` None and ``uid`` None: anonymous, insecure)."""

    login: str = ""
    uid: int | None = None
    principal: str | None = None
    operator: bool = False

    @classmethod
    def local_user(cls, uid: int, login: str) -> Caller:
        """A Unix socket's peer; root is the operator."""
        return cls(login=login, uid=uid, operator=uid == 0)

    @classmethod
    def token(cls, principal: str) -> Caller:
        return cls(principal=principal, operator=True)

    @classmethod
    def anonymous(cls) -> Caller:
        """A TCP caller of a service started ``--insecure-http``."""
        return cls(operator=True)

    @property
    def submitter(self) -> str:
        """How the job store records this caller as a job's submitter."""
        if self.uid is not None:
            return self.login
        if self.principal is not None:
            return f"token:{self.principal}"
        return "insecure-http"

    def describe(self) -> str:
        if self.uid is not None:
            return f"Unix user {self.login!r} (uid {self.uid})"
        if self.principal is not None:
            return f"principal {self.principal!r}"
        return "an anonymous caller (--insecure-http)"


def submit_problem(caller: Caller, user: str) -> str | None:
    """Why ``caller`` may not submit a job that runs as ``user`` (None: they may)."""
    if caller.operator or user == caller.login:
        return None
    return (
        f"{caller.describe()} may not submit a job to run as user {user!r}: a job runs as the "
        "user who submits it (only root, or an operator's token, may name another user); "
        "nothing was queued"
    )


def may_access(caller: Caller, user: str, submit_uid: int | None) -> bool:
    """Whether ``caller`` may read or cancel a job that runs as ``user``, submitted by
    ``submit_uid`` (None: not over the Unix socket)."""
    if caller.operator:
        return True
    if caller.uid is None:
        return False
    return user == caller.login or submit_uid == caller.uid


def list_filter(caller: Caller, asked: str | None) -> tuple[str | None, str | None]:
    """The user filter of a listing ``caller`` asked for with ``asked`` (None: everyone's), and
    why it is refused (None: it is not). An operator lists anyone's; anyone else only their own,
    which is what they get when they name nobody."""
    if caller.operator:
        return asked, None
    if asked is None or asked == caller.login:
        return caller.login, None
    return None, f"{caller.describe()} may list only their own jobs, not {asked!r}'s"
