"""Frameworks bundled with Agora, built on agora.sdk alone."""
