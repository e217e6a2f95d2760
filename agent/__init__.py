"""The Agora agent: core, containerizer, status updates, executors, daemon."""
