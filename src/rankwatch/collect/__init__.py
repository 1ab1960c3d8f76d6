"""Collection: find the plugin, build its environment, run a command under it."""
