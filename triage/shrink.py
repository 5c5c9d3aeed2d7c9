"""Shrink a failing config to a small one that fails with the same signature.

Greedy delta debugging as Hypothesis shrinks: for every field in turn, try its simplest value
first, then bisect between the simplest value and the current one; keep whatever still fails
with the same signature; repeat the passes until one changes nothing or the budget is spent.
Every attempt is a real run (triage.attempt.Runner: run_config with the sweep policy's gates for
that config). A candidate the config model rejects (attnconfig.parse_config raises ConfigError:
split_kv > 1 without return_lse, say) is skipped without a run, and a config already tried is
not run again.

Simplest values: g, heads, query and key tokens and splits 1; head dims MIN_HEAD_DIM (below it
the row gate fails correct kernels, sweeps/policy.py's known limitation, so a shrink there could
end on a different bug); bias, causal, prefix offsets, key lengths, LSE, transposes and an
explicit threshold off, the softmax scale on (the default); data_seed 0. The dtype is kept: it
is part of what the bug is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from attnconfig import AttentionConfig, ConfigError, parse_config
from triage.attempt import Observation, Runner
from triage.signature import Signature

MIN_HEAD_DIM = 8
DEFAULT_MAX_RUNS = 200
DEFAULT_MAX_SECONDS = 120.0


class _BudgetSpent(Exception):
    pass


@dataclass
class ShrinkResult:
    config: dict[str, Any]
    minimal_config: dict[str, Any]
    signature: Signature
    runs: int                     # real runs, the first (which gives the signature) included
    seconds: float
    budget_spent: bool            # stopped by max_runs or max_seconds, not by a pass that changed nothing
    steps: list[str] = field(default_factory=list)  # the accepted simplifications, in order

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "minimal_config": self.minimal_config, "runs": self.runs,
                "signature": self.signature.to_dict(), "seconds": round(self.seconds, 3),
                "budget_spent": self.budget_spent, "steps": self.steps}


Change = tuple[str, dict[str, Any]]


def _with(d: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**d, **changes}


def _set_g(d: dict[str, Any], g: int, keep: list[int] | None = None) -> dict[str, Any]:
    """g entries; the per-entry lists keep the entries `keep` (default: the first g)."""
    keep = keep if keep is not None else list(range(g))
    out = _with(d, g=g)
    for name in ("prefix_offset", "current_seq_len"):
        if d.get(name) is not None:
            out[name] = [d[name][i] for i in keep]
    return out


def _set_seq_len_k(d: dict[str, Any], sk: int) -> dict[str, Any]:
    out = _with(d, seq_len_k=sk)
    if d.get("current_seq_len") is not None:
        out["current_seq_len"] = [min(v, sk - 1) for v in d["current_seq_len"]]
    return out


def _feature_changes(d: dict[str, Any]) -> Iterator[Change]:
    """Features back to their simplest setting, one at a time (prefix offsets go with causal)."""
    if d["causal"]:
        yield "causal=False", {"causal": False, "prefix_offset": None}
    for name, simple in (("with_attn_bias", False), ("with_attn_scale", True), ("prefix_offset", None),
                         ("current_seq_len", None), ("trans_q", False), ("trans_k", False), ("trans_v", False),
                         ("trans_o", False), ("rms_threshold", None), ("return_lse", False)):
        if d[name] != simple:
            yield f"{name}={simple}", {name: simple}


# Integer dimensions: (name, simplest value, how to set it). Heads shrink as num_heads_kv with the
# ratio kept, then the ratio, so num_heads_q stays a multiple of num_heads_kv.
def _int_fields(d: dict[str, Any]) -> list[tuple[str, int, int, Callable[[dict[str, Any], int], dict[str, Any]]]]:
    ratio = d["num_heads_q"] // d["num_heads_kv"]
    fields = [
        ("g", d["g"], 1, lambda x, v: _set_g(x, v)),
        ("num_heads_kv", d["num_heads_kv"], 1,
         lambda x, v: _with(x, num_heads_kv=v, num_heads_q=v * (x["num_heads_q"] // x["num_heads_kv"]))),
        ("gqa_ratio", ratio, 1, lambda x, v: _with(x, num_heads_q=v * x["num_heads_kv"])),
        ("seq_len_q", d["seq_len_q"], 1, lambda x, v: _with(x, seq_len_q=v)),
        ("seq_len_k", d["seq_len_k"], 1, _set_seq_len_k),
        ("split_kv", d["split_kv"], 1, lambda x, v: _with(x, split_kv=v)),
        ("head_dim_qk", d["head_dim_qk"], min(MIN_HEAD_DIM, d["head_dim_qk"]), lambda x, v: _with(x, head_dim_qk=v)),
        ("head_dim_v", d["head_dim_v"], min(MIN_HEAD_DIM, d["head_dim_v"]), lambda x, v: _with(x, head_dim_v=v)),
    ]
    for name in ("prefix_offset", "current_seq_len"):
        for i, value in enumerate(d.get(name) or []):
            fields.append((f"{name}[{i}]", value, 0,
                           lambda x, v, n=name, i=i: _with(x, **{n: [*x[n][:i], v, *x[n][i + 1:]]})))
    fields.append(("data_seed", d["data_seed"], 0, lambda x, v: _with(x, data_seed=v)))
    return fields


def shrink(config: AttentionConfig | dict[str, Any] | str, runner: Runner, target: Signature | None = None, *,
           max_runs: int = DEFAULT_MAX_RUNS, max_seconds: float = DEFAULT_MAX_SECONDS) -> ShrinkResult:
    """The smallest config found that fails with `target` (default: the signature of a first run
    of `config`, which must not pass). Raises ValueError when the config passes."""
    start_config = parse_config(config)
    started = time.monotonic()
    runs_before = runner.runs
    if target is None:
        first = runner.run(start_config)
        if not first.signature.failing:
            raise ValueError(f"the config does not fail on {runner.backend_name} (outcome {first.outcome})")
        target = first.signature
    tried: dict[str, bool] = {start_config.content_hash(): True}
    best = start_config.to_dict()
    steps: list[str] = []

    def reproduces(d: dict[str, Any]) -> bool:
        try:
            c = parse_config(d)
        except ConfigError:
            return False
        key = c.content_hash()
        if key not in tried:
            if runner.runs - runs_before >= max_runs or time.monotonic() - started >= max_seconds:
                raise _BudgetSpent()
            obs: Observation = runner.run(c)
            tried[key] = obs.signature == target
        return tried[key]

    def accept(what: str, d: dict[str, Any]) -> bool:
        nonlocal best
        if reproduces(d):
            best = parse_config(d).to_dict()
            steps.append(what)
            return True
        return False

    spent = False
    try:
        changed = True
        while changed:
            before = dict(best)
            for what, changes in list(_feature_changes(best)):
                accept(what, _with(best, **changes))
            if best["g"] > 1:
                for keep in sorted({0, best["g"] - 1, *range(min(best["g"], 4))}):
                    if accept(f"g=1 (entry {keep})", _set_g(best, 1, [keep])):
                        break
            for name, _, lo, setter in _int_fields(best):
                _shrink_int(best, name, lo, setter, accept, lambda: best)
            changed = best != before
    except _BudgetSpent:
        spent = True
    return ShrinkResult(start_config.to_dict(), best, target, runner.runs - runs_before, time.monotonic() - started,
                        spent, steps)


def _shrink_int(d: dict[str, Any], name: str, lo: int,
                setter: Callable[[dict[str, Any], int], dict[str, Any]],
                accept: Callable[[str, dict[str, Any]], bool], current: Callable[[], dict[str, Any]]) -> None:
    """The simplest value, else a bisection between it (fails to reproduce) and the current value."""
    value = _value(current(), name)
    if value is None or value <= lo or accept(f"{name}={lo}", setter(current(), lo)):
        return
    bad, good = lo, value
    while good - bad > 1:
        mid = (bad + good) // 2
        if accept(f"{name}={mid}", setter(current(), mid)):
            good = mid
        else:
            bad = mid


def _value(d: dict[str, Any], name: str) -> int | None:
    """The current value of a shrinkable integer; None for a list entry gone with its list or with g."""
    if name == "gqa_ratio":
        return d["num_heads_q"] // d["num_heads_kv"]
    if "[" in name:
        field_name, index = name.rstrip("]").split("[")
        entries = d.get(field_name)
        return entries[int(index)] if entries is not None and int(index) < len(entries) else None
    return d[name]
