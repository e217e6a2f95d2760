"""``python -m agora.agent.server`` is ``agora-agent``."""

from agora.agent.server.main import main

main()
