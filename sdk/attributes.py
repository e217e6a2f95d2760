"""An agent's attributes as text (``agora-agent --attributes``, ``agora local
--agent-attributes``): ``name:value`` pairs separated by ``;``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["parse_attributes"]

_MAX_ATTRIBUTES: Final = 1024
_MAX_ATTRIBUTE_LEN: Final = 255


def parse_attributes(text: str | None) -> Mapping[str, str]:
    """``"rack:a;zone:w"`` -> ``{"rack": "a", "zone": "w"}``; raises ValueError on bad text.

    Entries are ``name:value`` separated by ``;``; whitespace around names and values is dropped,
    empty entries are skipped; a name may appear once and must not be empty. The value may
    contain ``:`` (only the first one separates).
    """
    out: dict[str, str] = {}
    if not text:
        return out
    for raw in text.split(";"):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, value = entry.partition(":")
        name, value = name.strip(), value.strip()
        if not sep:
            raise ValueError(f"bad attribute {entry!r}: expected name:value")
        if not name:
            raise ValueError(f"bad attribute {entry!r}: empty name")
        if name in out:
            raise ValueError(f"attribute {name!r} given twice")
        if len(name) > _MAX_ATTRIBUTE_LEN or len(value) > _MAX_ATTRIBUTE_LEN:
            raise ValueError(f"attribute {name[:40]!r}: names and values are at most 255 chars")
        out[name] = value
    if len(out) > _MAX_ATTRIBUTES:
        raise ValueError(f"at most {_MAX_ATTRIBUTES} attributes")
    return out
