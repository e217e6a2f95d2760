"""``python -m agora.agent.server.release WORK_DIR...``: destroy the containers and the cgroup
root of agents that could not do it themselves (killed, or crashed), for ``agora local`` and
other tools that run agents. Needs root; does nothing otherwise."""

from __future__ import annotations

import sys

from agora.agent.server.isolation import release_cgroups_of


def main(argv: list[str] | None = None) -> int:
    for work_dir in sys.argv[1:] if argv is None else argv:
        release_cgroups_of(work_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
