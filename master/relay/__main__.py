"""``python -m agora.master.relay`` is ``agora-relay``."""

from agora.master.relay.main import main

if __name__ == "__main__":
    main()
