"""Names of outcomes, gates and metrics: shared by the runner, the store, the API and reports."""
from __future__ import annotations

# SPEC §7, in the order reports list them.
OUTCOMES = ("pass", "fail", "nan", "error", "timeout", "oom", "not_applicable")
FAILING_OUTCOMES = ("fail", "nan", "error", "timeout", "oom")

# SPEC §5: the gate a failing config is charged to.
GATES = ("rms", "row", "lse", "partials", "err_ratio")

# SPEC §4 metrics, flat, one column each in the store. None where not applicable
# (no LSE returned, no partials exposed).
FLOAT_METRICS = (
    "out_rms", "out_row_err", "out_max_abs", "out_max_rel", "out_err_ratio",
    "lse_rms", "lse_max_abs", "lse_row_err",
    "partials_row_err", "partials_lse_max_abs",
)
COUNT_METRICS = (
    "out_nonfinite", "lse_inf_mismatch", "lse_nonfinite",
    "partials_invalid_bad", "partials_nonfinite",
)
METRIC_KEYS = FLOAT_METRICS + COUNT_METRICS
