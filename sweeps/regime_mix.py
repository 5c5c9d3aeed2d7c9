"""The data regimes a sweep draws (docs/spec.md §6): their shares, validation and the draw.

`data_regimes` of a sweep request maps regime names (attnconfig.regimes) to shares; a list of
names means equal shares. Shares are weights: they are divided by their sum. A sweep whose
request names none draws DEFAULT_REGIME_MIX, which is REGIME_MIX: half `normal`, a tenth each
other regime, so that every default sweep reaches the corners of docs/spec.md §1 under the
calibrated bounds of §5.

The regime of each draw comes from a stream of its own, `default_rng([seed, REGIME_STREAM])`,
one number per draw: the shapes a seed draws are the same whatever the mix, and a mix of
`normal` alone draws nothing, so such a sweep is the sweep of a seed before regimes existed.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from attnconfig.config import AttentionConfig
from attnconfig.regimes import DEFAULT_REGIME, REGIMES

REGIME_MIX: dict[str, float] = {r: (0.5 if r == DEFAULT_REGIME else 0.1) for r in REGIMES}
DEFAULT_REGIME_MIX: dict[str, float] = dict(REGIME_MIX)
REGIME_STREAM = 0x5E61


def mix_problems(value: Any) -> tuple[dict[str, float] | None, list[tuple[str, str]]]:
    """(the normalised mix, []) or (None, [(field, rule), ...]) for a data_regimes value."""
    field = "data_regimes"
    if isinstance(value, (list, tuple)):
        dup = sorted({r for r in value if list(value).count(r) > 1})
        if dup:
            return None, [(field, f"data_regimes must not repeat a regime; repeated: {', '.join(map(str, dup))}")]
        value = {r: 1.0 for r in value}
    if not isinstance(value, Mapping):
        return None, [(field, "data_regimes must be a list of regime names or an object {regime: share}")]
    problems: list[tuple[str, str]] = []
    if not value:
        problems.append((field, f"data_regimes must name at least one regime of {', '.join(REGIMES)}"))
    for name, share in value.items():
        if name not in REGIMES:
            problems.append((f"{field}.{name}", f"unknown regime {name!r}; allowed: {', '.join(REGIMES)}"))
        elif isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or share <= 0:
            problems.append((f"{field}.{name}", f"{name}={share!r}: a share must be a finite number > 0"))
    if problems:
        return None, problems
    total = float(sum(value.values()))
    # Canonical order (REGIMES), so the order a request lists them in does not change the sweep.
    return {r: float(value[r]) / total for r in REGIMES if r in value}, []


def regime_chooser(mix: Mapping[str, float], seed: int) -> Callable[[], str] | None:
    """A function giving the next draw's regime, or None when the mix is `normal` alone."""
    names = list(mix)
    if names == [DEFAULT_REGIME]:
        return None
    cum = np.cumsum([mix[r] for r in names])
    rng = np.random.default_rng([seed, REGIME_STREAM])

    def choose() -> str:
        return names[min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(names) - 1)]
    return choose


def with_regimes(draw: Callable[[np.random.Generator], AttentionConfig], mix: Mapping[str, float],
                 seed: int) -> Callable[[np.random.Generator], AttentionConfig]:
    """`draw` whose configs carry a regime drawn from the mix (see the module docstring)."""
    choose = regime_chooser(mix, seed)
    if choose is None:
        return draw

    def drawn(rng: np.random.Generator) -> AttentionConfig:
        c = draw(rng)
        regime = choose()
        return c if regime == c.data_regime else c.model_copy(update={"data_regime": regime})
    return drawn
