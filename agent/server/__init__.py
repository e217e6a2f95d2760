"""The agent daemon (``agora-agent``): sockets, timers, processes and disk around the agent core.

``python -m agora.agent.server --master tcp://HOST:5050`` (or the ``agora-agent`` script) runs it.
Modules: :mod:`~agora.agent.server.config` (options -> AgentConfig and DaemonSettings),
:mod:`~agora.agent.server.resources` (host detection), :mod:`~agora.agent.server.processes`
(executor processes), :mod:`~agora.agent.server.daemon` (the loop), and
:mod:`~agora.agent.server.main` (the entry point). Importing this package imports none of them.
"""
