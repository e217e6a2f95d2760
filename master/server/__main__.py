"""``python -m agora.master.server`` is ``agora-master``."""

from agora.master.server.main import main

if __name__ == "__main__":
    main()
