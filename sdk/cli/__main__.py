"""``python -m agora.sdk.cli`` is ``agora``."""

from __future__ import annotations

from agora.sdk.cli.main import main

raise SystemExit(main())
