"""Triage of a sweep's failures: how many distinct bugs, the smallest case of each, whether it
fails every time, and which commit broke it.

- signature.py  what a failure is (outcome, deciding gate, location: kernel family or the combine)
- features.py   facts about a config (fields and split arithmetic) and the predicates over them
- explain.py    the conjunction of up to two predicates that best separates a cluster from passes
- cluster.py    failures grouped by signature, symptoms of one bug merged
- attempt.py    one real run for triage (signature, output digest, time limit)
- child_main.py the child process of attempts on the device backends (isolation/child.py starts it)
- shrink.py     greedy delta debugging to a minimal failing config
- classify.py   deterministic, data-dependent, flaky or nondeterministic
- bisect.py     the first failing commit of a kernel repository's first-parent history
- sweep.py      triage_sweep: all of it for a stored sweep

Layer: above store, kernelsrc, sweeps, kernels, reference, attnconfig and settings; nothing
here imports the API, the CLI, the workers or CI.
"""
