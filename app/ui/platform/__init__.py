"""Per-platform pieces behind small interfaces: global hotkeys, synthetic keys, clipboard."""
