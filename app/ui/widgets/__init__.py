"""The tray app's windows: tray menu, answer popup, chat window, settings."""
