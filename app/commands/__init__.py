"""CLI subcommands of the core package (each module: ``register(subparsers)`` + a handler)."""
