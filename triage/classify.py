"""Does a failure repeat? The same inputs again, and other data.

The config runs `repeats` times with its own inputs (the same data_seed draws the same bits)
and once with each of `seeds` as its data_seed:
- `flaky`: the same inputs gave different signatures, or different output bits; or the config
  passed every repeat though it failed with the target signature before (`failed_before`: the
  run of the sweep or of the shrink that chose it);
- `deterministic`: every run failed with the target signature, whatever the data;
- `data_dependent`: the same inputs always failed, some other data passed (or failed otherwise);
- `nondeterministic`: the config passes every time but its outputs differ bit for bit between
  identical runs (a race or an uninitialised read that the gates do not catch yet);
- `passes`: it passed every time with the same bits, and no earlier failure is known.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from attnconfig import AttentionConfig, parse_config
from triage.attempt import Runner
from triage.signature import Signature

DEFAULT_REPEATS = 3
DEFAULT_SEEDS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Classification:
    kind: str
    repeats: int
    same_input_failing: int                  # of the repeats, runs with the target signature
    distinct_outputs: int                    # distinct output digests among the repeats
    seeds: list[int] = field(default_factory=list)
    seeds_failing: list[int] = field(default_factory=list)
    runs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def classify(config: AttentionConfig | dict[str, Any], runner: Runner, target: Signature | None = None, *,
             repeats: int = DEFAULT_REPEATS, seeds: Sequence[int] = DEFAULT_SEEDS,
             failed_before: bool = False) -> Classification:
    """Classify `config`; `target` defaults to the signature of its first run. `failed_before`:
    the same config and inputs are known to have failed with `target` (then it needs a target)."""
    c = parse_config(config)
    before = runner.runs
    same = [runner.run(c) for _ in range(max(1, repeats))]
    target = target or same[0].signature
    signatures = {o.signature for o in same}
    digests = {o.digest for o in same}
    failing_same = sum(o.signature == target for o in same)
    if not any(s.failing for s in signatures):
        if failed_before:  # failed once, passed since: a race or uninitialised memory
            return Classification("flaky", len(same), 0, len(digests), runs=runner.runs - before)
        kind = "nondeterministic" if len(digests) > 1 else "passes"
        return Classification(kind, len(same), 0, len(digests), runs=runner.runs - before)
    if len(signatures) > 1 or len(digests) > 1:
        return Classification("flaky", len(same), failing_same, len(digests), runs=runner.runs - before)
    others = [s for s in seeds if s != c.data_seed]
    failing_seeds = [s for s in others
                     if runner.run(parse_config({**c.to_dict(), "data_seed": s})).signature == target]
    kind = "deterministic" if len(failing_seeds) == len(others) else "data_dependent"
    return Classification(kind, len(same), failing_same, len(digests), others, failing_seeds, runner.runs - before)
