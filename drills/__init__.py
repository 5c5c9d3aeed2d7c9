"""`make drills`: see drills/__main__.py."""
