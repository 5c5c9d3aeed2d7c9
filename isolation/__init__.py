"""Running one config apart from the rest: in a long-lived process (executor.py: one backend per
kind, backend_cache.py; the watchdog's and the fault's process exits), a time limit on its
running time (timelimit.py), a child process that is replaced after a fault (child.py), a config
under compute-sanitizer (sanitize.py), the result of a config that did not run (unrun.py), and
code that did not ship run confined (sandbox.py), in a process of its own that answers over a
pickle-free wire (wire.py, kernel_main.py, confined.py)."""
