"""Names of outcomes, gates and metrics: shared by the runner, the store, the API and reports."""
from __future__ import annotations

# docs/spec.md §7, in the order reports list them. `fault`: the config's kernels faulted on the device
# or stored outside their buffers (guard zones); `unsafe`: a compute-sanitizer run of it found
# a memory error or a race (its numbers may be right); `error` is kept for the system's own
# failures (a compiler, a driver call, a broken install).
OUTCOMES = ("pass", "fail", "nan", "fault", "unsafe", "error", "timeout", "oom", "not_applicable")
FAILING_OUTCOMES = ("fail", "nan", "fault", "unsafe", "error", "timeout", "oom")

# docs/spec.md §5: the gate a failing config is charged to.
GATES = ("rms", "row", "lse", "partials", "err_ratio")

# docs/spec.md §4 metrics, flat, one column each in the store. None where not applicable
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
