"""Running one config apart from the rest: a time limit on its running time (timelimit.py), a
child process that is replaced after a fault (child.py), a config under compute-sanitizer
(sanitize.py), and code that did not ship run confined (sandbox.py), in a process of its own
that answers over a pickle-free wire (wire.py, kernel_main.py, confined.py)."""
