"""The command line's other commands: install/uninstall into clients, images, cache."""
