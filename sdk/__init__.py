"""Agora's public contract: resources, messages and codec, transport, drivers, CLI."""
