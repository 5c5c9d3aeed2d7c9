"""The sweep request (docs/spec.md §6 and the REST/CLI names of §8) and its validation.

`SweepSpec` is what a client asks for; the sampler (`sweeps.sampler`) turns it into configs.
Field names are the REST names of docs/spec.md §8. Every error names the field and the rule; use
`parse_sweep_spec` to get a `SweepSpecError` (a `ConfigError`, so the CLI and API that already
report config errors report these the same way) instead of pydantic's `ValidationError`.

Range overrides (`ranges`, CLI `--range NAME=LO:HI`) replace the default range of one sampled
field; how each one acts on the draw is written down in `sweeps.sampler`'s module docstring.
An override that leaves a draw with no possible value (e.g. a head range without a power of
two) is rejected here, when the request is made, not when sampling starts.
"""
from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Literal, Mapping

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from attnconfig.config import DTYPES, INT4_MAX, INT8_MAX, MAX_HEAD_DIM, ConfigError, storable_str, validation_problems
from sweeps.regime_mix import DEFAULT_REGIME_MIX, mix_problems

GIB = 1 << 30
# The most draws one request may cost. A draw (sample and prefilter one config) takes about
# 50 us of one CPU, so a request that cannot be satisfied stops within a minute instead of
# holding an API thread for hours; max_draws above it is refused and the default
# (1000 * samples) is cut to it. samples is bounded by it too, so the cap always allows samples.
MAX_DRAWS = 1_000_000
# The most earlier sweeps a coverage-guided request may take as its prior (store.coverage reads
# every finished row of each, so the prior costs a scan of that many sweeps at submission).
MAX_PRIOR_SWEEPS = 100
MAX_LABEL = 200  # sweeps.label is VARCHAR(200)
Label = storable_str(MAX_LABEL)

# Default sampled ranges (docs/spec.md §6). `g` and `seq_len_q` are further capped by max_tokens at
# draw time; heads and split_kv are drawn as powers of two inside their range.
DEFAULT_RANGES: dict[str, tuple[int, int]] = {
    "g": (1, 256),
    "seq_len_q": (1, 16384),
    "seq_len_k": (1, 16384),
    "num_heads_q": (1, 64),
    "num_heads_kv": (1, 64),
    "head_dim_qk": (1, MAX_HEAD_DIM),
    "head_dim_v": (1, MAX_HEAD_DIM),
    "split_kv": (1, 128),
}
# The fair coins of the draw (docs/spec.md §6), as 0:1 ranges: NAME=0 pins one off, NAME=1 on (e.g. a
# sweep of untransposed layouts only, trans_q=0 trans_k=0 trans_v=0, the tensor-core path's).
COIN_FIELDS = ("with_attn_scale", "with_attn_bias", "causal", "trans_q", "trans_k", "trans_v", "trans_o")
DEFAULT_RANGES.update({c: (0, 1) for c in COIN_FIELDS})
RANGE_KEYS = tuple(DEFAULT_RANGES)
# Fields that must stay within a hard limit of the config model, whatever the override says.
_RANGE_MAX = {"head_dim_qk": MAX_HEAD_DIM, "head_dim_v": MAX_HEAD_DIM, **{c: 1 for c in COIN_FIELDS}}

Backend = Literal["auto", "cpu", "cuda", "hip", "hostemu"]
DtypeName = Literal["f16", "bf16", "f32", "i8"]


class SweepSpecError(ConfigError):
    """A sweep request broke a rule; `problems` holds (field, rule) pairs, str() names both."""


def powers_of_two(lo: int, hi: int, *, start: int = 1) -> list[int]:
    """Powers of two p with max(lo, start) <= p <= hi, ascending."""
    out: list[int] = []
    p = 1
    while p <= hi:
        if p >= lo and p >= start:
            out.append(p)
        p <<= 1
    return out


def head_choices(rq: tuple[int, int], rkv: tuple[int, int]) -> dict[str, Any]:
    """The choices of the heads draw under ranges rq (num_heads_q) and rkv (num_heads_kv).

    Returns {"single": bool, "mha": [h...], "gqa_q": [...], "gqa_kv": [...], "gqa": bool}:
    (1, 1) is possible when 1 is in both ranges; MHA and GQA draw powers of two >= 2 inside
    the ranges (the default ranges [1, 64] give exactly docs/spec.md §6's 2^1..2^6); GQA is possible
    when some Hq choice exceeds some Hkv choice.
    """
    pq = powers_of_two(*rq, start=2)
    pkv = powers_of_two(*rkv, start=2)
    return {
        "single": rq[0] <= 1 <= rq[1] and rkv[0] <= 1 <= rkv[1],
        "mha": [h for h in pq if rkv[0] <= h <= rkv[1]],
        "gqa_q": pq,
        "gqa_kv": pkv,
        "gqa": bool(pq and pkv and max(pq) > min(pkv)),
    }


def _range_problems(ranges: Mapping[str, tuple[int, int]]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for key, (lo, hi) in ranges.items():
        field = f"ranges.{key}"
        if key not in DEFAULT_RANGES:
            problems.append((field, f"unknown range {key!r}; allowed: {', '.join(RANGE_KEYS)}"))
            continue
        floor = 0 if key in COIN_FIELDS else 1
        # Sampled values become config fields stored in int4 columns.
        if hi > INT4_MAX or lo > INT4_MAX:
            problems.append((field, f"{key}={lo}:{hi}: lo and hi must be <= {INT4_MAX}"))
            continue
        if lo < floor:
            problems.append((field, f"{key}={lo}:{hi}: lo must be >= {floor}"))
        if lo > hi:
            problems.append((field, f"{key}={lo}:{hi}: lo must be <= hi"))
        cap = _RANGE_MAX.get(key)
        if cap is not None and hi > cap:
            problems.append((field, f"{key}={lo}:{hi}: hi must be <= {cap}"))
    if problems:
        return problems
    full = {**DEFAULT_RANGES, **ranges}
    if "split_kv" in ranges and not powers_of_two(*full["split_kv"]):
        lo, hi = full["split_kv"]
        problems.append(("ranges.split_kv", f"split_kv={lo}:{hi} contains no power of two; split_kv is drawn from powers of two"))
    if "num_heads_q" in ranges or "num_heads_kv" in ranges:
        hc = head_choices(full["num_heads_q"], full["num_heads_kv"])
        if not (hc["single"] or hc["mha"] or hc["gqa"]):
            field = "ranges.num_heads_q" if "num_heads_q" in ranges else "ranges.num_heads_kv"
            problems.append((field, (
                f"num_heads_q={full['num_heads_q'][0]}:{full['num_heads_q'][1]} with num_heads_kv="
                f"{full['num_heads_kv'][0]}:{full['num_heads_kv'][1]} allows no heads draw: heads are "
                "(1, 1), or powers of two >= 2 with num_heads_q == num_heads_kv (MHA) or > (GQA)")))
    return problems


class SweepSpec(BaseModel):
    """A sweep request. Field names are docs/spec.md §8's REST names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: StrictInt = Field(default=50, ge=1, le=MAX_DRAWS)
    seed: StrictInt | None = Field(default=None, ge=0, le=INT8_MAX)
    dtypes: list[DtypeName] = Field(default_factory=lambda: list(DTYPES), min_length=1, max_length=len(DTYPES))
    backend: Backend = "auto"
    label: Label | None = None
    max_tokens: StrictInt = Field(default=16384, ge=1, le=INT8_MAX)
    splitkv_extra_bytes_limit: StrictInt | None = Field(default=None, ge=0, le=INT8_MAX)
    reference_flops_limit: StrictFloat = Field(default=2e10, gt=0, allow_inf_nan=False)
    reference_bytes_limit: StrictInt = Field(default=GIB, ge=1, le=INT8_MAX)
    ranges: dict[str, tuple[StrictInt, StrictInt]] = Field(default_factory=dict, max_length=len(RANGE_KEYS))
    max_draws: StrictInt | None = Field(default=None, ge=1, le=MAX_DRAWS)
    err_ratio_gate: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Regime -> share (a list of names: equal shares), normalised; sweeps.regime_mix.
    data_regimes: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_REGIME_MIX))
    # Prefer draws that land in the least covered cells (sweeps.guided, docs/spec.md §6).
    coverage_guided: bool = False
    # With coverage_guided: the newest N finished sweeps of the store are the guided draw's prior
    # (their cell counts, store.coverage.prior_counts); 0: the sweep's own draws only.
    coverage_prior_sweeps: StrictInt = Field(default=0, ge=0, le=MAX_PRIOR_SWEEPS)
    # The kernel under test (kernels/plugins, docs/plugins.md): "attnsweep" (the project's own, on
    # `backend`), a shipped plug-in, an entry point, module:attr, path/file.py:attr or so:PATH.
    kernel: str = Field(default="attnsweep", min_length=1, max_length=1000)

    @field_validator("kernel")
    @classmethod
    def _known_form(cls, v: str) -> str:
        from kernels.plugins.load import KernelSpecError, parse_kernel

        try:
            return parse_kernel(v, check=False).text
        except KernelSpecError as exc:
            raise ValueError(str(exc).removeprefix("kernel: ")) from None

    @field_validator("data_regimes", mode="before")
    @classmethod
    def _valid_regimes(cls, v: Any) -> dict[str, float]:
        mix, problems = mix_problems(v)
        if problems:
            raise ValueError(SweepSpecError(problems))
        return mix

    @field_validator("dtypes")
    @classmethod
    def _no_duplicate_dtypes(cls, v: list[str]) -> list[str]:
        dup = sorted({d for d in v if v.count(d) > 1})
        if dup:
            raise ValueError(f"dtypes must not repeat a dtype; repeated: {', '.join(dup)}")
        return v

    @field_validator("ranges")
    @classmethod
    def _valid_ranges(cls, v: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        problems = _range_problems(v)
        if problems:
            raise ValueError(SweepSpecError(problems))
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "SweepSpec":
        problems: list[tuple[str, str]] = []
        if self.max_draws is not None and self.max_draws < self.samples:
            problems.append(("max_draws", f"max_draws={self.max_draws} must be >= samples={self.samples}"))
        if self.coverage_prior_sweeps and not self.coverage_guided:
            problems.append(("coverage_prior_sweeps", f"coverage_prior_sweeps={self.coverage_prior_sweeps} needs "
                                                      "coverage_guided: only a guided draw reads a prior"))
        if problems:
            raise ValueError(SweepSpecError(problems))
        return self

    # Resolved values ------------------------------------------------------------------------
    def resolved_seed(self, today: _dt.date | None = None) -> int:
        """The seed, or the ISO week number (1..53) of `today` (default: today) when None."""
        if self.seed is not None:
            return self.seed
        return (today or _dt.date.today()).isocalendar().week

    def resolved_max_draws(self) -> int:
        """The cap on draws: max_draws, or 1000 * samples (at most MAX_DRAWS) when None."""
        return self.max_draws if self.max_draws is not None else min(1000 * self.samples, MAX_DRAWS)

    def range_of(self, key: str) -> tuple[int, int]:
        """The range in force for a sampled field: the override, else docs/spec.md §6's default."""
        return tuple(self.ranges.get(key, DEFAULT_RANGES[key]))  # type: ignore[return-value]


def parse_sweep_spec(obj: Mapping[str, Any] | SweepSpec) -> SweepSpec:
    """Build a SweepSpec from a dict, raising SweepSpecError naming each field and rule."""
    if isinstance(obj, SweepSpec):
        return obj
    if not isinstance(obj, Mapping):
        raise SweepSpecError([("sweep", "must be a JSON object")])
    try:
        return SweepSpec.model_validate(dict(obj))
    except ValidationError as exc:
        raise SweepSpecError(validation_problems(exc)) from None


# Ends are integers, also in exponent form (1e6); an end past int4 is then refused by its rule.
_NUM = r"(-?\d+(?:[eE]\+?\d+)?)"
_RANGE_RE = re.compile(rf"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*{_NUM}\s*(?::\s*{_NUM}\s*)?$")


def _range_end(text: str) -> int:
    """An integer written as digits or as mantissa and exponent ("1e40"), without float rounding.
    Values past 10**40 come back as +-10**40: the int4 rule refuses them either way, and Python
    refuses to convert digit strings past 4300 digits."""
    mantissa, _, exponent = text.lower().partition("e")
    digits = len(mantissa.lstrip("-").lstrip("0")) + (int(exponent.lstrip("+")[:4] or 0) if exponent else 0)
    if digits > 40:
        return -10**40 if mantissa.startswith("-") else 10**40
    return int(mantissa) * 10 ** (int(exponent.lstrip("+")) if exponent else 0)


def parse_range(text: str) -> tuple[str, tuple[int, int]]:
    """Parse a CLI `--range` value: "g=1:64" -> ("g", (1, 64)); "g=8" means 8:8.

    Raises SweepSpecError (field "range") naming the value, the expected form and the allowed
    names, or the broken rule (lo >= 1, lo <= hi, head dims <= 1024, ...).
    """
    m = _RANGE_RE.match(text)
    if not m:
        raise SweepSpecError([("range", (
            f"--range {text!r}: expected NAME=LO:HI with integers, e.g. g=1:64; "
            f"NAME one of {', '.join(RANGE_KEYS)}"))])
    key, lo_s, hi_s = m.group(1), m.group(2), m.group(3)
    lo = _range_end(lo_s)
    hi = _range_end(hi_s) if hi_s is not None else lo
    problems = _range_problems({key: (lo, hi)})
    if problems:
        raise SweepSpecError(problems)
    return key, (lo, hi)


def parse_ranges(texts: list[str] | tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Parse repeated `--range` values; naming the same field twice is an error."""
    out: dict[str, tuple[int, int]] = {}
    for t in texts:
        key, rng = parse_range(t)
        if key in out:
            raise SweepSpecError([(f"ranges.{key}", f"--range {key} given twice ({out[key][0]}:{out[key][1]} and {rng[0]}:{rng[1]})")])
        out[key] = rng
    return out
