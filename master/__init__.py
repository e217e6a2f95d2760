"""The Agora master: allocator, state machine, election, registry, daemon."""
