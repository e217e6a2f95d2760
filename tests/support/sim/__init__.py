"""Deterministic simulation of the real master core with simulated agents, frameworks and network.

``runner.run(scenario, seed)`` is the entry point; see tests/sim/test_simulation.py.
"""
