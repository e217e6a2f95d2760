"""Split ``mpirun --tag-output`` output into (rank, stream, line).

Open MPI puts ``[JOBID,RANK]<stdout>:`` (or ``<stderr>:``, or ``<stddiag>:`` for its own
diagnostics from a rank, reported here as ``stderr``) before each *chunk* a rank writes, not
before each line, and chunks of different ranks arrive glued with no newline between them::

    [1,1]<stdout>:part[1,2]<stdout>:x\\n[1,1]<stdout>:rest\\n

gives ``(2, "stdout", "x")`` then ``(1, "stdout", "partrest")``. Text after a tag, up to the
next tag, belongs to that rank and stream; each rank and stream keeps its partial line until
its newline arrives. Text before any tag (mpirun's own messages) is rank ``None``, ``stdout``.

Open MPI 4.1 also repeats the tag after every newline inside a chunk, so an untagged line after
a rank's line is really mpirun's own (its "process exited" banner on stderr, say). With
``per_line_tags=True`` such a line goes to rank ``None``; by default it stays with the last tag.

Pure: bytes in, lines out, no I/O. Lines are decoded as UTF-8 with ``errors="replace"`` once
complete, so a character split across :meth:`TagSplitter.feed` calls decodes whole.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["Line", "TagSplitter"]

#: (rank or None for mpirun's own text, "stdout" or "stderr", the line without its newline).
Line = tuple[int | None, str, str]
_Owner = tuple[int | None, str]

_TAG: Final = re.compile(rb"\[(\d{1,10}),(\d{1,10})\]<(stdout|stderr|stddiag)>:")
#: Every prefix of a tag (checked against the names below); at most 10 digits each, like _TAG.
_PARTIAL: Final = re.compile(rb"\[(?:\d{1,10}(?:,(?:\d{1,10}(?:\](?:<([a-z]*)(>:?)?)?)?)?)?)?")
_NAMES: Final = (b"stdout", b"stderr", b"stddiag")
_STREAMS: Final = {b"stdout": "stdout", b"stderr": "stderr", b"stddiag": "stderr"}
_MPIRUN: Final[_Owner] = (None, "stdout")


def _could_be_tag(tail: bytes) -> bool:
    """Whether ``tail`` (starting at a ``[``) may be the start of a tag cut off by a chunk end."""
    match = _PARTIAL.fullmatch(tail)
    if match is None:
        return False
    name, closed = match.group(1), match.group(2)
    if name is None:
        return True
    if closed:
        return name in _NAMES
    return any(full.startswith(name) for full in _NAMES)


class TagSplitter:
    """Feed it mpirun's tagged output as it arrives; get back the lines completed so far."""

    def __init__(self, *, per_line_tags: bool = False) -> None:
        self._per_line_tags = per_line_tags
        self._owner: _Owner = _MPIRUN
        self._partial: dict[_Owner, bytes] = {}
        self._held = b""  # a possible tag cut off at the end of the last feed

    def feed(self, data: bytes) -> list[Line]:
        """Take the next bytes; return the lines they complete, in the order completed."""
        data = self._held + data
        self._held = b""
        out: list[Line] = []
        pos = 0
        for match in _TAG.finditer(data):
            self._add(data[pos : match.start()], out)
            self._owner = (int(match.group(2)), _STREAMS[match.group(3)])
            pos = match.end()
        rest = data[pos:]
        cut = rest.rfind(b"[")
        if cut >= 0 and _could_be_tag(rest[cut:]):
            self._held = rest[cut:]
            rest = rest[:cut]
        self._add(rest, out)
        return out

    def flush(self) -> list[Line]:
        """End of stream: every partial line that is left, each rank's as one line."""
        out: list[Line] = []
        if self._held:
            held, self._held = self._held, b""
            self._add(held, out)
        for (rank, stream), text in self._partial.items():
            out.append((rank, stream, text.decode("utf-8", errors="replace")))
        self._partial.clear()
        return out

    def _add(self, text: bytes, out: list[Line]) -> None:
        if not text:
            return
        owner = self._owner
        if self._per_line_tags and owner != _MPIRUN:
            newline = text.find(b"\n")
            if newline >= 0:
                self._owner = _MPIRUN
                self._add_to(owner, text[: newline + 1], out)
                self._add(text[newline + 1 :], out)
                return
        self._add_to(owner, text, out)

    def _add_to(self, owner: _Owner, text: bytes, out: list[Line]) -> None:
        *lines, rest = (self._partial.pop(owner, b"") + text).split(b"\n")
        rank, stream = owner
        out.extend((rank, stream, line.decode("utf-8", errors="replace")) for line in lines)
        if rest:
            self._partial[owner] = rest
