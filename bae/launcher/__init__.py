"""The `bae` command: one service by name, or the whole stack in the foreground (`bae run`, `make run`)."""
