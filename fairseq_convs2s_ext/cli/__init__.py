"""The plugin's console commands (setup.py's entry points)."""
