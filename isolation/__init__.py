"""Running code in isolation: code that did not ship runs confined (sandbox.py), in a process of
its own that answers over a pickle-free wire (wire.py, kernel_main.py, confined.py)."""
