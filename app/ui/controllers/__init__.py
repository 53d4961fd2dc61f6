"""Non-visual logic of the tray app: the engine host, background tasks, actions, local API."""
