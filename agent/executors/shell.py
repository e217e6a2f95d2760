"""How a shell command task is run: ``/bin/sh -c`` with the command, which ``exec``\\ s it when it
is one simple command.

Without the ``exec`` the shell stays as the task's process and the command runs as its child;
dash (Debian's /bin/sh) dies at once on the kill's SIGTERM while its child, which gets the
SIGTERM too (it is in the task's process group), may still be cleaning up. With the ``exec``
the command itself is the task's process: its exit status is the task's, and its SIGTERM
handler (a script's ``trap … TERM``, a Python handler) is what the kill talks to. Anything but
one plain command is left as it is; a compound command still gets the SIGTERM through the
process group, and the executor waits for the whole group within the grace period.
"""

from __future__ import annotations

import re
import shlex
from typing import Final

__all__ = ["SHELL", "shell_argv", "with_exec"]

SHELL: Final = "/bin/sh"

#: The only operators one simple command may hold: redirections (``>&`` and ``<&`` included).
_REDIRECTIONS: Final = frozenset({"<", ">", ">>", "<>", ">&", "<&", ">|"})
_OPERATOR_CHARS: Final = "();<>|&\n"
#: Words not to exec: reserved words, and dash's built-ins (some have no program of their own;
#: the rest may lack one in a task's image, and they end quickly anyway).
_NOT_A_PROGRAM: Final = frozenset(
    {
        "!", "{", "}", "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done",
        "case", "esac", "in", "function", "select", "time", "[[",
        ".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo",
        "eval", "exec", "exit", "export", "false", "fc", "fg", "getopts", "hash", "jobs", "kill",
        "local", "printf", "pwd", "read", "readonly", "return", "set", "shift", "source", "test",
        "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset", "wait",
    }
)  # fmt: skip
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _tokens(command: str) -> list[str] | None:
    """``command`` in words and operators, as far as the shell's grammar matters here (an
    operator inside quotes comes out like one outside: that only errs on the side of no exec).
    None when it cannot be read (unbalanced quotes: the shell will say so)."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=_OPERATOR_CHARS)
    lex.whitespace = " \t"  # a newline separates commands
    lex.commenters = ""  # a '#' inside a word is no comment to the shell
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:
        return None


def with_exec(command: str) -> str:
    """``command`` prefixed with ``exec`` when it is one simple command, else unchanged."""
    tokens = _tokens(command)
    if not tokens:
        return command
    operators = [t for t in tokens if t and all(c in _OPERATOR_CHARS for c in t)]
    if any(op not in _REDIRECTIONS for op in operators):
        return command  # a list, a pipeline, a background job, a subshell, several lines
    first = tokens[0]
    if first in _NOT_A_PROGRAM or first in _REDIRECTIONS or first.isdigit():
        return command  # a built-in, a compound command, or words only a shell can read
    if _ASSIGNMENT.match(first):
        return command
    return f"exec {command}"


def shell_argv(command: str) -> list[str]:
    """The argv that runs ``command`` as a task: ``/bin/sh -c`` (``exec`` where it can)."""
    return [SHELL, "-c", with_exec(command)]
