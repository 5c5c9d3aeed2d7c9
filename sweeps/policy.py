"""Tolerance policy and gates (docs/spec.md §5): the threshold a config is judged by, and its verdict.

Threshold (RMS gate on O), exactly one per config, in this order:
  `explicit` (config.rms_threshold) > `saturated_softmax` (with_attn_scale false and
  head_dim_qk > 64: 0.15) > `uniform_attention` (data_regime uniform: 4x the dtype's) >
  `bf16` (0.01) > `default` (f16, f32, i8: 0.005).
Regimes other than `normal` may widen the row and LSE bounds (sweeps.regime_bounds).
The single-config `verify` command uses `strict_rms_threshold` instead (reason `strict`:
0.001 for f16/bf16/i8 outputs - i8 configs output f16 - and 3e-5 for f32), still beaten by an
explicit config threshold, so a reproducer that carries the sweep's threshold reproduces it.

Gates, in order; the first that fails names the verdict's `failed_gate`:
  rms      out_rms <= threshold
  row      out_row_err <= GATE_BOUNDS[dtype]["row_err"]
  lse      (config.return_lse) lse_max_abs <= GATE_BOUNDS[dtype]["lse_max_abs"] and
           lse_inf_mismatch == 0
  partials (partials exposed: partials_row_err not None) partials_row_err <= the row bound,
           partials_lse_max_abs <= the lse bound (when reported) and partials_invalid_bad == 0
           (an invalid or empty split that is not exactly O_s = 0, LSE_s = -inf)
  err_ratio (only when the sweep sets err_ratio_gate) out_err_ratio <= err_ratio_gate
A bound is inclusive (a metric equal to it passes); a NaN metric fails its gate.

NaN classification: any non-finite count > 0 makes the outcome `nan` before any gate is
checked. Its `failed_gate` names where it was found, checked in gate order: out_nonfinite ->
`rms` (the first gate on O), lse_nonfinite -> `lse`, partials_nonfinite -> `partials`; the detail
lists all three counts. (A -inf LSE where the reference is finite is also an `lse_inf_mismatch`;
if the verifier counts it as non-finite it is `nan`, otherwise a `fail` of the lse gate.)

A gate whose metric is needed but missing (None) raises ValueError: that is a verifier bug,
never a silent pass.

GATE_BOUNDS - PROVISIONAL, to be replaced by the GPU calibration of docs/spec.md §5 (>= 10,000
configs of the correct kernels, zero false failures with >= 2x margin). Derived from a numpy
emulation of a correct kernel (f32 accumulation, P rounded to the storage dtype before P.V, i8:
P to f16; O rounded to the output dtype) against the f64 reference, over ~1,500 sampled configs
up to head dim 1024 and seq_len_k 16384:
  row_err: with head_dim_v >= 8 a correct kernel's worst row is one output ulp (f16/i8 2^-10 =
    9.8e-4, bf16 2^-7 = 7.8e-3, f32 ~2e-5). Bound = 4 output ulps (f32: 2e-4, ~10x).
  lse_max_abs: f16/bf16/f32 configs return an f32 LSE whose worst error was 4.6e-5 (|LSE| up to
    ~200 with unscaled head_dim 1024 logits): bound 1e-3 (~20x). i8 configs return an f16 LSE
    (|LSE| < 32 under the default sampling): worst one f16 ulp at [16, 32) = 0.0156; bound 0.04.
  A grossly wrong row (zeros, another row's values, a wrong split) errs by O(1) relative and
  fails every bound; a wrong LSE by log(fraction of mass missing), e.g. 0.69 for half.
KNOWN LIMITATION of docs/spec.md §4's row_err (normalised by the row's own max |value|): for
head_dim_v < 8 a correct kernel's row can cancel to ~0 and row_err grows without bound
(observed 1.6-1.8 at head_dim_v = 1 for f16/bf16/i8, 0.025 for f32; 0.04-0.06 at head_dim_v
2..7). No per-dtype bound below 2 is free of false failures there; the fix belongs to the
verifier's normaliser (e.g. the row max of |P|.|V|), and the calibration decides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from attnconfig.config import AttentionConfig, parse_config
from sweeps.regime_bounds import UNIFORM_RMS_FACTOR, regime_bounds

SATURATED_THRESHOLD = 0.15
SATURATED_HEAD_DIM = 64  # saturated softmax when with_attn_scale is false and head_dim_qk > this
BF16_THRESHOLD = 0.01
DEFAULT_THRESHOLD = 0.005
STRICT_THRESHOLD = {"f16": 1e-3, "bf16": 1e-3, "f32": 3e-5}  # by output storage dtype

THRESHOLD_REASONS = ("explicit", "saturated_softmax", "uniform_attention", "bf16", "default", "strict")

# The one table of per-dtype bounds (keyed by config dtype). PROVISIONAL: see module docstring.
GATE_BOUNDS: dict[str, dict[str, float]] = {
    "f16": {"row_err": 4e-3, "lse_max_abs": 1e-3},
    "bf16": {"row_err": 3.2e-2, "lse_max_abs": 1e-3},
    "f32": {"row_err": 2e-4, "lse_max_abs": 1e-3},
    "i8": {"row_err": 4e-3, "lse_max_abs": 4e-2},
}


def output_dtype(c: AttentionConfig) -> str:
    """Storage dtype of O: the config dtype, except i8 whose O (and LSE) is f16 (docs/spec.md §1)."""
    return "f16" if c.dtype == "i8" else c.dtype


def rms_threshold(c: AttentionConfig) -> tuple[float, str]:
    """The sweep's RMS threshold and its reason, in docs/spec.md §5's order."""
    if c.rms_threshold is not None:
        return float(c.rms_threshold), "explicit"
    if not c.with_attn_scale and c.head_dim_qk > SATURATED_HEAD_DIM:
        return SATURATED_THRESHOLD, "saturated_softmax"
    if c.data_regime == "uniform":
        base = BF16_THRESHOLD if c.dtype == "bf16" else DEFAULT_THRESHOLD
        return UNIFORM_RMS_FACTOR * base, "uniform_attention"
    if c.dtype == "bf16":
        return BF16_THRESHOLD, "bf16"
    return DEFAULT_THRESHOLD, "default"


_sweep_threshold = rms_threshold  # evaluate()/gates_for() take a parameter of the same name


def strict_rms_threshold(c: AttentionConfig) -> tuple[float, str]:
    """The single-config verify threshold: explicit wins, else rocMLIR's verifier defaults."""
    if c.rms_threshold is not None:
        return float(c.rms_threshold), "explicit"
    return STRICT_THRESHOLD[output_dtype(c)], "strict"


def gates_for(
    c: AttentionConfig,
    *,
    rms_threshold: float | None = None,
    threshold_reason: str | None = None,
    err_ratio_gate: float | None = None,
    bounds: Mapping[str, Mapping[str, float]] = GATE_BOUNDS,
    strict: bool = False,
) -> dict[str, Any]:
    """Every threshold and bound the gates apply to this config, as a flat JSON-able dict.

    Keys: `rms` (threshold), `rms_reason`, `row` (row_err bound, also used per valid split),
    `lse` (only when return_lse; also used for partial LSEs), `err_ratio` (only when gated).
    The threshold is `rms_threshold` when given (reason `threshold_reason`, default
    `explicit`), else the sweep policy (`strict=False`) or the verify policy (`strict=True`).
    A reproducer carries this dict; `evaluate_with_gates` applies it unchanged.
    """
    if rms_threshold is None:
        rms_threshold, threshold_reason = (strict_rms_threshold if strict else _sweep_threshold)(c)
    elif threshold_reason is None:
        threshold_reason = "explicit"
    if c.dtype not in bounds:
        raise KeyError(f"gate bounds have no entry for dtype {c.dtype!r}")
    b = bounds[c.dtype]
    row, lse = regime_bounds(c, float(b["row_err"]), float(b["lse_max_abs"]))
    gates: dict[str, Any] = {"rms": float(rms_threshold), "rms_reason": threshold_reason, "row": row}
    if c.return_lse:
        gates["lse"] = lse
    if err_ratio_gate is not None:
        gates["err_ratio"] = float(err_ratio_gate)
    return gates


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "pass" | "fail" | "nan"
    failed_gate: str | None  # None | "rms" | "row" | "lse" | "partials" | "err_ratio"
    detail: str
    gates: dict[str, Any] = field(default_factory=dict)
    # What decided a fail or nan: the metric, its value, the bound it broke and where the bound
    # comes from (the dashboard shows them; `detail` says the same in one line).
    metric: str | None = None
    value: float | int | None = None
    bound: float | int | None = None
    why: str = ""

    @property
    def threshold_reason(self) -> str | None:
        return self.gates.get("rms_reason")


def _num(x: float | int) -> str:
    return str(x) if isinstance(x, int) else f"{x:.6g}"


def _need(metrics: Mapping[str, Any], key: str, why: str) -> Any:
    v = metrics.get(key)
    if v is None:
        raise ValueError(f"metric {key} is missing but needed for the {why} gate")
    return v


def _over(value: float, bound: float) -> bool:
    """True when value breaks an inclusive upper bound; NaN always breaks it."""
    return not (value <= bound)


def evaluate(
    c: AttentionConfig,
    metrics: Mapping[str, Any],
    *,
    rms_threshold: float,
    threshold_reason: str,
    err_ratio_gate: float | None = None,
    bounds: Mapping[str, Mapping[str, float]] = GATE_BOUNDS,
) -> Verdict:
    """The verdict of one config's metrics (docs/spec.md §4 keys, None where not applicable)."""
    gates = gates_for(c, rms_threshold=rms_threshold, threshold_reason=threshold_reason,
                      err_ratio_gate=err_ratio_gate, bounds=bounds)
    return evaluate_with_gates(c, metrics, gates)


def _partials_broken(dtype: str, metrics: Mapping[str, Any],
                     gates: Mapping[str, Any]) -> tuple[str, float | int, float | int, str] | None:
    """The partials gate's first broken bound (metric, value, bound, why); None when all hold.
    The partials must be exposed (partials_row_err not None)."""
    prow = float(metrics["partials_row_err"])
    if _over(prow, gates["row"]):
        return "partials_row_err", prow, gates["row"], f"{dtype} row bound, per valid split"
    plse = metrics.get("partials_lse_max_abs")
    if plse is not None and "lse" in gates and _over(float(plse), gates["lse"]):
        return "partials_lse_max_abs", float(plse), gates["lse"], f"{dtype} lse bound, per valid split"
    bad = int(_need(metrics, "partials_invalid_bad", "partials"))
    if bad != 0:
        return "partials_invalid_bad", bad, 0, "invalid or empty splits must be exactly O_s=0, LSE_s=-inf"
    return None


def partials_hold(c: AttentionConfig, metrics: Mapping[str, Any], gates: Mapping[str, Any]) -> bool | None:
    """Whether the per-split partials agree with the reference's: finite where the reference is,
    and every bound of the partials gate holding, whatever the other gates said. None where the
    run exposed no partials (split_kv 1, a backend without them, a config that never ran) or
    the gates lack a bound the partials gate needs."""
    if metrics.get("partials_row_err") is None or "row" not in gates:
        return None
    if int(metrics.get("partials_nonfinite") or 0) > 0:
        return False
    try:
        return _partials_broken(c.dtype, metrics, gates) is None
    except ValueError:   # partials_invalid_bad missing: nothing to tell
        return None


def evaluate_with_gates(c: AttentionConfig, metrics: Mapping[str, Any], gates: Mapping[str, Any]) -> Verdict:
    """Apply a gates dict (from `gates_for`, e.g. carried by a reproducer) to the metrics."""
    gates = dict(gates)
    gates.setdefault("rms_reason", "explicit")
    if c.return_lse and "lse" not in gates:
        raise ValueError("gates lack the lse bound though the config returns LSE")

    # NaN first: any non-finite value where the reference is finite.
    nonfinite = {k: int(metrics.get(k) or 0) for k in ("out_nonfinite", "lse_nonfinite", "partials_nonfinite")}
    where = {"out_nonfinite": "rms", "lse_nonfinite": "lse", "partials_nonfinite": "partials"}
    for key, gate in where.items():
        if nonfinite[key] > 0:
            counts = ", ".join(f"{k}={v}" for k, v in nonfinite.items())
            why = "non-finite values where the reference is finite"
            return Verdict("nan", gate, f"{why} ({counts})", gates, key, nonfinite[key], 0, why)

    def fail(gate: str, metric: str, value: float | int, bound: float | int, why: str) -> Verdict:
        return Verdict("fail", gate, f"{gate}: {metric}={_num(value)} > {_num(bound)} ({why})", gates,
                       metric, value, bound, why)

    checked: list[str] = []
    # 1. RMS on O.
    out_rms = float(_need(metrics, "out_rms", "rms"))
    if _over(out_rms, gates["rms"]):
        return fail("rms", "out_rms", out_rms, gates["rms"], f"{gates['rms_reason']} threshold")
    checked.append(f"out_rms={_num(out_rms)} <= {_num(gates['rms'])}")
    # 2. Row gate on O.
    row = float(_need(metrics, "out_row_err", "row"))
    if _over(row, gates["row"]):
        return fail("row", "out_row_err", row, gates["row"], f"{c.dtype} row bound")
    checked.append(f"out_row_err={_num(row)} <= {_num(gates['row'])}")
    # 3. LSE gate, when LSE is returned.
    if c.return_lse:
        lse = float(_need(metrics, "lse_max_abs", "lse"))
        if _over(lse, gates["lse"]):
            return fail("lse", "lse_max_abs", lse, gates["lse"], f"{c.dtype} lse bound")
        mismatch = int(_need(metrics, "lse_inf_mismatch", "lse"))
        if mismatch != 0:
            return fail("lse", "lse_inf_mismatch", mismatch, 0, "-inf against a finite value")
        checked.append(f"lse_max_abs={_num(lse)} <= {_num(gates['lse'])}")
    # 4. Partials gate, when the backend exposes partials.
    if metrics.get("partials_row_err") is not None:
        broken = _partials_broken(c.dtype, metrics, gates)
        if broken is not None:
            return fail("partials", *broken)
        checked.append(f"partials_row_err={_num(float(metrics['partials_row_err']))} <= {_num(gates['row'])}")
    # 5. err_ratio, only when the sweep asks for it.
    if "err_ratio" in gates:
        er = float(_need(metrics, "out_err_ratio", "err_ratio"))
        if _over(er, gates["err_ratio"]):
            return fail("err_ratio", "out_err_ratio", er, gates["err_ratio"], "sweep err_ratio_gate")
        checked.append(f"out_err_ratio={_num(er)} <= {_num(gates['err_ratio'])}")
    return Verdict("pass", None, "all gates hold: " + ", ".join(checked), gates)


__all__ = [
    "GATE_BOUNDS", "THRESHOLD_REASONS", "Verdict", "evaluate", "evaluate_with_gates", "gates_for",
    "output_dtype", "partials_hold", "rms_threshold", "strict_rms_threshold",
]


# --- a stored failure, explained ---------------------------------------------------------------
THRESHOLD_WHY = {
    "explicit": "the config's own rms_threshold",
    "saturated_softmax": f"saturated softmax: with_attn_scale=false and head_dim_qk > {SATURATED_HEAD_DIM}",
    "bf16": "bf16 threshold",
    "default": "default threshold (f16, f32, i8)",
    "strict": "verify's strict threshold",
}


@dataclass(frozen=True)
class GateFinding:
    """The metric that decided a failure against its bound, and where the bound comes from
    (metric, value and bound None where no gate decided: error, timeout, oom)."""

    gate: str | None
    metric: str | None
    value: float | int | None
    bound: float | int | None
    why: str


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def explain_failure(config: Mapping[str, Any], outcome: str | None, failed_gate: str | None,
                    metrics: Mapping[str, Any], gates: Mapping[str, Any] | None, threshold_reason: str | None,
                    detail: str | None) -> GateFinding:
    """A stored failure's verdict re-derived from its metrics and gates by the policy that made
    it (docs/spec.md §5). Outcomes no gate decides, and rows whose re-derived verdict differs
    from the stored one, are explained by the first line of their detail."""
    verdict = None
    if outcome in ("fail", "nan") and gates:
        try:
            verdict = evaluate_with_gates(parse_config(dict(config)), metrics, gates)
        except (ValueError, KeyError):
            verdict = None
        if verdict is not None and (verdict.outcome, verdict.failed_gate) != (outcome, failed_gate):
            verdict = None
    if verdict is None:
        return GateFinding(failed_gate, None, None, None, _first_line(detail) or outcome or "")
    why = verdict.why
    if verdict.outcome == "fail" and verdict.failed_gate == "rms":
        why = THRESHOLD_WHY.get(threshold_reason or "", why)
    return GateFinding(verdict.failed_gate, verdict.metric, verdict.value, verdict.bound, why)
