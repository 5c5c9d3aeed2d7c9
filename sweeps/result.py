"""The outcome of one config on one backend (docs/spec.md §7), as the runner returns it."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from attnconfig import AttentionConfig
from attnconfig.outcomes import METRIC_KEYS
from reference.facts import FACT_KEYS


@dataclass
class ConfigResult:
    config: AttentionConfig
    outcome: str
    failed_gate: str | None = None
    detail: str = ""
    not_applicable_reason: str | None = None
    metrics: dict[str, float | int | None] = field(default_factory=lambda: dict.fromkeys(METRIC_KEYS))
    gates: dict[str, Any] | None = None  # sweeps.policy.gates_for: every bound the verdict used
    backend: str = ""
    device: str = ""
    driver_version: str = ""
    compiler_version: str = ""
    variant: str | None = None
    block_n: int | None = None
    source_hash: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    reproducer: str = ""
    # The kernel under test (kernels/plugins): its name and version; `kernel_spec` is how it is
    # asked for (`--kernel`), what the reproducer carries.
    kernel: str = "attnsweep"
    kernel_version: str = ""
    kernel_spec: str = "attnsweep"
    #: not stored: the config left its process's device context unusable (a sticky fault), so
    #: the process must be replaced before it runs another config
    poisons_process: bool = False

    @property
    def config_hash(self) -> str:
        return self.config.content_hash()

    def to_row(self) -> dict[str, Any]:
        """Column values of store.models.ConfigRun for this result."""
        row: dict[str, Any] = {
            "outcome": self.outcome,
            "failed_gate": self.failed_gate,
            "detail": self.detail[:20000] if self.detail else None,
            "not_applicable_reason": self.not_applicable_reason,
            "rms_threshold": self.gates["rms"] if self.gates else None,
            "threshold_reason": self.gates["rms_reason"] if self.gates else None,
            "gates": self.gates,
            "backend": self.backend,
            "device": self.device,
            "driver_version": self.driver_version,
            "compiler_version": self.compiler_version,
            "variant": self.variant,
            "block_n": self.block_n,
            "source_hash": self.source_hash,
            "reproducer": self.reproducer,
            "kernel": self.kernel,
            "kernel_version": self.kernel_version or None,
        }
        for key in ("compile_s", "inputs_s", "run_s", "reference_s", "verify_s", "total_s"):
            row[key] = self.timings.get(key)
        row.update({k: self.metrics.get(k) for k in METRIC_KEYS})
        facts = {k: self.metrics[k] for k in FACT_KEYS if self.metrics.get(k) is not None}
        row["facts"] = facts or None
        return row


def new_result(config: AttentionConfig, gates: dict[str, Any], backend: str, defects: frozenset[str],
               info: Any = None, outcome: str = "error", detail: str = "", kernel: str = "attnsweep") -> ConfigResult:
    """A result of `config` with the device facts of `info` (a kernels.backends.base.DeviceInfo; None
    where the device could not be asked) and the reproducer of its gates: every result starts
    here, so a reproducer is built in this one place. `kernel`: the kernel asked for, where
    `info` does not say (kernels/plugins)."""
    spec = info.kernel_spec if info else kernel
    return ConfigResult(
        config=config, outcome=outcome, detail=detail, gates=gates,
        backend=info.backend if info else backend, device=info.device if info else "",
        driver_version=info.driver_version if info else "", compiler_version=info.compiler_version if info else "",
        reproducer=reproducer_command(config, info.backend if info else backend, gates, defects, spec),
        kernel=info.kernel if info else kernel_name(kernel), kernel_version=info.kernel_version if info else "",
        kernel_spec=spec,
    )


def kernel_name(spec: str) -> str:
    """The name a kernel is stored under before it has said its own: its spec (a path's file name;
    a built tree's plug-in)."""
    if spec.startswith("tree:"):
        spec = spec.rpartition("|")[2]
    if spec.startswith("so:"):
        return spec.rsplit("/", 1)[-1][:200]
    return spec[:200]


def at_commit(reproducer: str, commit: str) -> str:
    """The reproducer of a result of a kernel revision: run in a checkout of that commit."""
    return f"git checkout {shlex.quote(commit)} && {reproducer}" if reproducer else reproducer


def reproducer_command(config: AttentionConfig, backend: str, gates: dict[str, Any], defects: frozenset[str],
                       kernel: str = "attnsweep") -> str:
    """One line that re-runs this config with the same gates (and kernel, when it is not the
    project's own), so it reproduces the verdict. The config carries only the fields a reader
    needs (AttentionConfig.to_compact_json)."""
    parts = ["attnsweep", "verify", *(["--kernel", kernel] if kernel != "attnsweep" else []), "--backend", backend,
             "--config", config.to_compact_json(), "--gates", json.dumps(gates, sort_keys=True, separators=(",", ":"))]
    for d in sorted(defects):
        parts += ["--defect", d]
    return " ".join(shlex.quote(p) for p in parts)
