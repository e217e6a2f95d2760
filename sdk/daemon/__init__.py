"""What Agora's own daemons share and framework authors do not need.

The master, the agent and the batch service each read settings from flags, the environment and
a TOML file (``settings``), serve a small HTTP API (``httpd``) behind bearer tokens
(``http_auth``), keep their log lines to a few per peer (``ratelimit``) and may write a history
of what they did for the fault suite's checker (``history``). The agent and ``agora image``
share the root-filesystem image store (``images``).

Nothing here is part of the public SDK: ``agora.sdk``'s root holds the protocol, the drivers
and the operator client.
"""
