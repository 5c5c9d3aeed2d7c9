"""Drawing a sweep's configs (docs/spec.md §6): one seeded stream, prefilters, duplicates, a draw cap.

`sample(spec, splitkv_budget)` draws configs from ONE stream,
`numpy.random.default_rng(spec.resolved_seed())`, until `spec.samples` configs pass every
prefilter (`sweeps.filters`) and are not duplicates. Nothing else feeds the stream, so the same
spec and seed give the same configs in the same order, whatever runs them.

Draw order of one config (each line consumes the stream in this order; "coin" is
`rng.random() < 0.5`; "logu[lo, hi]" is the log-uniform integer
`min(hi, max(lo, floor(exp(log(lo) + rng.random() * (log(hi + 1) - log(lo))))))`, i.e.
P(k) proportional to log((k+1)/k); "pick(xs)" is `xs[rng.integers(len(xs))]`):

 1. seq_len_k = logu[Sk_lo, Sk_hi]                                   default [1, 16384]
 2. g         = logu[g_lo, max(g_lo, min(g_hi, max_tokens // seq_len_k))]   default g [1, 256]
 3. KV-cache coin. KV-cache mode (only possible when 1 is in the seq_len_q range; the coin is
    drawn anyway): seq_len_q = 1, current_seq_len = rng.integers(0, seq_len_k, size=g).
    Otherwise seq_len_q = logu[q_lo, max(q_lo, min(q_hi, max_tokens // g))]  default [1, 16384]
 4. heads: one r = rng.random() picks the mode by cumulative weights (1,1): 1/4, MHA: 1/4,
    GQA: 1/2 (renormalised over the modes the head ranges allow; the default allows all three).
    MHA: Hq = Hkv = pick(MHA set). GQA: Hq = pick(Pq), Hkv = pick(Pkv), both drawn again until
    Hq > Hkv. Pq / Pkv are the powers of two >= 2 in the num_heads_q / num_heads_kv ranges
    (default [1, 64] -> {2, ..., 64}, docs/spec.md's 2^u with u in [1, 6]); the MHA set is Pq restricted
    to the num_heads_kv range; (1, 1) is allowed when 1 is in both ranges.
 5. return_lse coin; it is forced true (the coin still drawn) when 1 is not in the split_kv
    range. split_kv = pick(powers of two in the split_kv range) when return_lse, else 1.
    Default range [1, 128] -> {1, 2, 4, ..., 128}.
 6. dtype = pick(requested dtypes in canonical order f16, bf16, f32, i8) - so the order in which
    a request lists them does not change the sweep.
 7. head_dim_qk, then head_dim_v, each: coin; heads -> pick(common set {32, 64, 80, 96, 128,
    192, 256} restricted to that field's range), tails (or an empty restricted set) ->
    logu[lo, hi] of the field's range (default [1, 1024]).
 8. seven coins, in order, as one `rng.random(7) < 0.5`: with_attn_scale, with_attn_bias,
    causal, trans_q, trans_k, trans_v, trans_o. A coin pinned by a range (NAME=0 or NAME=1) is
    still drawn, so pinning one (causal aside: it decides whether step 9 draws) changes no
    other field of any config.
 9. only when causal: prefix coin; heads -> prefix_offset = current_seq_len (KV-cache mode; the
    decode position, so the query sees the cache) or rng.integers(0, seq_len_k, size=g)
    (otherwise). No draw when not causal.
10. data_seed = rng.integers(0, 2**31).
11. data_regime: from a stream of its own (sweeps.regime_mix), so the mix changes no other field.

Range overrides (`spec.ranges`) replace the default range of that field as shown above: an
override of seq_len_k replaces [1, 16384] by [lo, hi] for the log-uniform draw; g's and
seq_len_q's overrides replace their [1, 256] / [1, 16384] while the max_tokens cap still lowers
the upper end (never below lo; a g range that cannot fit max_tokens then shows up as
`max_tokens` rejections and, if nothing fits, as SamplingExhausted); heads and split_kv
overrides restrict the power-of-two choices to the range (they may also extend them, e.g.
num_heads_q=128:128); head-dim overrides (within [1, 1024]) restrict the common set and the
log-uniform range. An override that leaves no possible value (heads or split_kv ranges without
a suitable power of two) is rejected by SweepSpec validation with a message naming the range.

Each drawn config goes through the prefilters in docs/spec.md's order; a config that passes but whose
content hash was already accepted is counted `duplicate`. `filtered` counts every draw that
was not accepted, so sum(filtered.values()) == draws - len(configs). When `draws` reaches the
cap (spec.max_draws, default 1000 * samples) before `samples` configs are accepted,
`SamplingExhausted` is raised with the cap, the accepted count and the counts so far.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from attnconfig.config import DTYPES, AttentionConfig
from sweeps.filters import ALL_REASONS, DUPLICATE, Prefilter
from sweeps.guided import CapReached, collect_guided
from sweeps.regime_mix import with_regimes
from sweeps.spec import COIN_FIELDS, SweepSpec, SweepSpecError, head_choices, powers_of_two

COMMON_HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)
# Mode weights of the heads draw (docs/spec.md §6): (1, 1), MHA, GQA.
HEAD_MODE_WEIGHTS = (0.25, 0.25, 0.5)
DATA_SEED_BOUND = 2**31


class SamplingExhausted(RuntimeError):
    """The draw cap was reached before enough configs passed the filters."""

    def __init__(self, cap: int, accepted: int, samples: int, filtered: dict[str, int], seed: int):
        self.cap, self.accepted, self.samples, self.filtered, self.seed = cap, accepted, samples, dict(filtered), seed
        counts = ", ".join(f"{k}={v}" for k, v in filtered.items())
        super().__init__(
            f"sampling stopped at the cap of {cap} draws (max_draws) with {accepted} of {samples} "
            f"configs accepted (seed {seed}); rejections so far: {counts}. Widen the ranges or raise "
            "the filter limits or max_draws.")


@dataclass
class SampleResult:
    configs: list[AttentionConfig]
    filtered: dict[str, int]
    draws: int
    seed: int
    splitkv_budget: int = 0
    accepted_hashes: list[str] = field(default_factory=list, repr=False)


def _logu(rng: np.random.Generator, lo: int, hi: int) -> int:
    """Log-uniform integer in [lo, hi]: floor of exp(uniform(log lo, log(hi + 1)))."""
    if lo >= hi:
        return lo
    a = math.log(lo)
    v = int(math.exp(a + rng.random() * (math.log(hi + 1) - a)))
    return min(hi, max(lo, v))


class ConfigDrawer:
    """Draws one config at a time from a stream, following the module docstring's order.

    Built once per spec: the choice sets implied by the ranges are computed here, so a draw
    is a handful of scalar numpy calls.
    """

    def __init__(self, spec: SweepSpec):
        self.max_tokens = spec.max_tokens
        self.sk = spec.range_of("seq_len_k")
        self.g = spec.range_of("g")
        self.sq = spec.range_of("seq_len_q")
        self.kv_cache_possible = self.sq[0] <= 1 <= self.sq[1]
        self.pinned = [None if lo != hi else bool(lo) for lo, hi in map(spec.range_of, COIN_FIELDS)]
        hc = head_choices(spec.range_of("num_heads_q"), spec.range_of("num_heads_kv"))
        self.mha = hc["mha"]
        self.gqa_q, self.gqa_kv = hc["gqa_q"], hc["gqa_kv"]
        allowed = (hc["single"], bool(hc["mha"]), hc["gqa"])
        total = sum(w for w, ok in zip(HEAD_MODE_WEIGHTS, allowed) if ok)
        if total == 0:
            raise SweepSpecError([("ranges.num_heads_q", "the head ranges allow no heads draw")])
        cum, acc = [], 0.0
        for w, ok in zip(HEAD_MODE_WEIGHTS, allowed):
            acc += (w / total) if ok else 0.0
            cum.append(acc if ok else -1.0)
        self.head_cum = cum  # r < cum[i] picks mode i (first match among allowed modes)
        self.split_choices = powers_of_two(*spec.range_of("split_kv"))
        if not self.split_choices:
            raise SweepSpecError([("ranges.split_kv", "the split_kv range contains no power of two")])
        self.force_lse = 1 not in self.split_choices
        self.dtypes = [d for d in DTYPES if d in spec.dtypes]
        self.head_dims = []
        for key in ("head_dim_qk", "head_dim_v"):
            lo, hi = spec.range_of(key)
            self.head_dims.append(((lo, hi), [d for d in COMMON_HEAD_DIMS if lo <= d <= hi]))

    def _heads(self, rng: np.random.Generator) -> tuple[int, int]:
        r = rng.random()
        mode = 2
        for i, c in enumerate(self.head_cum):
            if c >= 0 and r < c:
                mode = i
                break
        else:  # r at the top edge of floating point: the last allowed mode
            mode = max(i for i, c in enumerate(self.head_cum) if c >= 0)
        if mode == 0:
            return 1, 1
        if mode == 1:
            h = self.mha[int(rng.integers(len(self.mha)))]
            return h, h
        nq, nkv = len(self.gqa_q), len(self.gqa_kv)
        while True:
            hq = self.gqa_q[int(rng.integers(nq))]
            hkv = self.gqa_kv[int(rng.integers(nkv))]
            if hq > hkv:
                return hq, hkv

    def draw(self, rng: np.random.Generator) -> AttentionConfig:
        # 1-3: sizes first, then a batch that fits, then the query rows.
        sk = _logu(rng, *self.sk)
        g_hi = max(self.g[0], min(self.g[1], self.max_tokens // sk))
        g = _logu(rng, self.g[0], g_hi)
        kv_cache = rng.random() < 0.5 and self.kv_cache_possible
        if kv_cache:
            sq = 1
            current = [int(x) for x in rng.integers(0, sk, size=g)]
        else:
            sq_hi = max(self.sq[0], min(self.sq[1], self.max_tokens // g))
            sq = _logu(rng, self.sq[0], sq_hi)
            current = None
        # 4: heads.
        hq, hkv = self._heads(rng)
        # 5: return_lse, split_kv.
        return_lse = rng.random() < 0.5 or self.force_lse
        split_kv = self.split_choices[int(rng.integers(len(self.split_choices)))] if return_lse else 1
        # 6: dtype.
        dtype = self.dtypes[int(rng.integers(len(self.dtypes)))]
        # 7: head dims.
        dims = []
        for (lo, hi), common in self.head_dims:
            if rng.random() < 0.5 and common:
                dims.append(common[int(rng.integers(len(common)))])
            else:
                dims.append(_logu(rng, lo, hi))
        # 8: fair coins, in order.
        coins = [bool(x) if pin is None else pin for x, pin in zip(rng.random(7) < 0.5, self.pinned)]
        scale, bias, causal, tq, tk, tv, to = coins
        # 9: causal prefix.
        prefix = None
        if causal and rng.random() < 0.5:
            prefix = list(current) if kv_cache else [int(x) for x in rng.integers(0, sk, size=g)]
        # 10: data seed.
        data_seed = int(rng.integers(0, DATA_SEED_BOUND))
        return AttentionConfig(
            dtype=dtype, g=g, seq_len_q=sq, seq_len_k=sk, num_heads_q=hq, num_heads_kv=hkv,
            head_dim_qk=dims[0], head_dim_v=dims[1], with_attn_scale=scale, with_attn_bias=bias,
            causal=causal, prefix_offset=prefix, current_seq_len=current, trans_q=tq, trans_k=tk,
            trans_v=tv, trans_o=to, return_lse=return_lse, split_kv=split_kv, data_seed=data_seed,
        )


def sample(spec: SweepSpec, splitkv_budget: int, prior: Any = None) -> SampleResult:
    """Draw `spec.samples` configs passing every prefilter (see the module docstring).

    With `spec.coverage_guided`, draws are steered to the least covered cells of the sweep so
    far plus `prior` (a sweeps.coverage.CellCounts of earlier sweeps; sweeps.guided).

    Raises SamplingExhausted when the draw cap is reached first.
    """
    seed = spec.resolved_seed()
    draw = with_regimes(ConfigDrawer(spec).draw, spec.data_regimes, seed)
    prefilter = Prefilter.from_spec(spec, splitkv_budget)
    if spec.coverage_guided:
        try:
            configs, hashes, filtered, draws = collect_guided(
                draw, np.random.default_rng(seed), prefilter, samples=spec.samples, cap=spec.resolved_max_draws(),
                prior=prior, mma=spec.backend == "cuda")
        except CapReached as exc:
            raise SamplingExhausted(spec.resolved_max_draws(), exc.accepted, spec.samples, exc.filtered, seed) from None
        result = SampleResult(configs=configs, filtered=filtered, draws=draws, seed=seed, accepted_hashes=hashes)
    else:
        result = collect_configs(draw, np.random.default_rng(seed), prefilter,
                                 samples=spec.samples, cap=spec.resolved_max_draws(), seed=seed)
    result.splitkv_budget = splitkv_budget
    return result


def collect_configs(
    draw: Callable[[np.random.Generator], AttentionConfig],
    rng: np.random.Generator,
    prefilter: Prefilter,
    *,
    samples: int,
    cap: int,
    seed: int,
) -> SampleResult:
    """The acceptance loop of `sample`: draw, filter, skip duplicates, count, stop at the cap."""
    filtered = {r: 0 for r in ALL_REASONS}
    configs: list[AttentionConfig] = []
    hashes: list[str] = []
    seen: set[str] = set()
    draws = 0
    while len(configs) < samples:
        if draws >= cap:
            raise SamplingExhausted(cap, len(configs), samples, filtered, seed)
        c = draw(rng)
        draws += 1
        reason = prefilter.reason(c)
        if reason is None:
            h = c.content_hash()
            if h in seen:
                reason = DUPLICATE
            else:
                seen.add(h)
                hashes.append(h)
                configs.append(c)
                continue
        filtered[reason] += 1
    return SampleResult(configs=configs, filtered=filtered, draws=draws, seed=seed, accepted_hashes=hashes)
