"""The master state machine: handle(sender, message, now) and tick(now) return actions."""
