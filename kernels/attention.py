"""One attention call through a backend: the library entry point.

`split_kv: 0` asks for the automatic split count (kernels/autosplit.py), sized to the backend's
GPU (its multiprocessors, and whether it runs the mma path). 0 is an option of this call, not
a config value: the config that ran, with the count chosen, comes back beside the outputs, and
that is what a result or a reproducer records.
"""
from __future__ import annotations

from typing import Any, Mapping

from attnconfig import AttentionConfig, parse_config
from kernels.autosplit import resolve_split
from kernels.backends.base import Backend, RunOutput


def resolve_config(backend: Backend, config: AttentionConfig | Mapping[str, Any]) -> AttentionConfig:
    """The config `backend` runs for `config`: split_kv 0 replaced by the automatic count.
    Raises ValueError naming the field where the config is invalid or the backend has no GPU."""
    if isinstance(config, AttentionConfig):
        return config
    raw = resolve_split(dict(config), backend.device_info().multiprocessors,
                        mma=bool(getattr(backend, "mma_capable", False)))
    return parse_config(raw)


def attention(backend: Backend, config: AttentionConfig | Mapping[str, Any],
              inputs: Mapping[str, Any] | None = None) -> tuple[AttentionConfig, RunOutput]:
    """Run `config` on `backend` (inputs: the config's own, reference.make_inputs, by default).
    Returns the config that ran and its outputs."""
    c = resolve_config(backend, config)
    if inputs is None:
        from reference import make_inputs

        inputs = make_inputs(c)
    return c, backend.run(backend.prepare(c), c, inputs)
