"""The plugin's console commands (``convs2s-*``), each a library part and a ``main``."""
