"""``agora-relay``: many agents over one connection to the leading master.

Each agent is one connection at the master, so a master's open-file limit bounds its agents. A
relay accepts the agents' connections itself (with CURVE, admitting the same keys a master
would) and carries their frames to whichever master leads over one connection per master, each
frame tagged with the agent's routing id and principal. The master treats every agent behind a
relay as a peer of its own, checks its calls as that agent's principal, and accepts relayed
frames only from principals its ACL names in ``relays``, and only agents' messages.

To its agents a relay looks like a master group of one: it answers DETECT_LEADER itself and
tells them (LEADER) when the group's leader goes and when a new one takes over, so that they
re-register as they would with a master.

:mod:`.core` keeps the relay's books (pure); :mod:`.relay` moves the frames.
"""
