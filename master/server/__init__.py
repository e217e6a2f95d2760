"""The master daemon: binds the master's ROUTER socket and drives ``agora.master.core.Master``.

Run it as ``agora-master`` or ``python -m agora.master.server``; options in
:mod:`agora.master.server.config`.
"""

from agora.master.server.config import OPTIONS, DaemonSettings, load_settings, settings_from
from agora.master.server.daemon import MasterDaemon
from agora.master.server.process import serve

__all__ = ["OPTIONS", "DaemonSettings", "MasterDaemon", "load_settings", "serve", "settings_from"]
