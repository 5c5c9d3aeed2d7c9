"""Submitting a sweep, the one use case behind POST /sweeps, the CI webhook, `attnsweep submit`
and `attnsweep run`: check the queue and budget, plan, commit, then enqueue it for the service's
workers or execute it in this machine's pool (`sweep`); a pushed commit's CI sweep (`ci`)."""
