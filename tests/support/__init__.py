"""Test kits shared by the unit, simulation and benchmark suites."""
