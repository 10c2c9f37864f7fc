"""The plugin's console commands (``convs2s-*``): each its arguments and a ``main``, over the
library modules that do the work."""
