"""The outcome of one config on one backend (SPEC §7), as the runner returns it."""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from attnconfig import AttentionConfig
from attnconfig.outcomes import METRIC_KEYS


@dataclass(frozen=True)
class Gates:
    """Every threshold a verdict depends on; a reproducer carries all of them."""

    rms_threshold: float
    threshold_reason: str
    row_err: float
    lse_max_abs: float
    err_ratio: float | None = None

    def to_json(self) -> str:
        import json

        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


@dataclass
class ConfigResult:
    config: AttentionConfig
    outcome: str
    failed_gate: str | None = None
    detail: str = ""
    not_applicable_reason: str | None = None
    metrics: dict[str, float | int | None] = field(default_factory=lambda: dict.fromkeys(METRIC_KEYS))
    gates: Gates | None = None
    backend: str = ""
    device: str = ""
    driver_version: str = ""
    compiler_version: str = ""
    variant: str | None = None
    block_n: int | None = None
    source_hash: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    reproducer: str = ""

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
            "rms_threshold": self.gates.rms_threshold if self.gates else None,
            "threshold_reason": self.gates.threshold_reason if self.gates else None,
            "gates": asdict(self.gates) if self.gates else None,
            "backend": self.backend,
            "device": self.device,
            "driver_version": self.driver_version,
            "compiler_version": self.compiler_version,
            "variant": self.variant,
            "block_n": self.block_n,
            "source_hash": self.source_hash,
            "reproducer": self.reproducer,
        }
        for key in ("compile_s", "inputs_s", "run_s", "reference_s", "verify_s", "total_s"):
            row[key] = self.timings.get(key)
        row.update({k: self.metrics.get(k) for k in METRIC_KEYS})
        return row


def reproducer_command(config: AttentionConfig, backend: str, gates: Gates | None, defects: frozenset[str]) -> str:
    """One line that re-runs this config with the same gates, so it reproduces the verdict."""
    parts = ["attnsweep", "verify", "--backend", backend, "--config", config.to_json()]
    if gates is not None:
        parts += ["--gates", gates.to_json()]
    for d in sorted(defects):
        parts += ["--defect", d]
    return " ".join(shlex.quote(p) for p in parts)
