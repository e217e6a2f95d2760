"""Executors that ship with the agent: the command executor (``agora.agent.executors.command``).

Kept import-light: the agent starts them as processes (``python -m
agora.agent.executors.command``), never by importing them.
"""
