"""The attention config: every field of docs/spec.md §1, its validation and its content hash.

This module is the project's shared vocabulary and imports nothing of the project outside
attnconfig, so that
`reference/` and `kernels/` can read a config without reaching up into the sweep logic.
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from attnconfig.regimes import DEFAULT_REGIME, Regime

DTYPES = ("f16", "bf16", "f32", "i8")
Dtype = Literal["f16", "bf16", "f32", "i8"]
MAX_HEAD_DIM = 1024
# What the store's integer columns hold: int4 (Integer) and int8 (BigInteger), signed. Every
# integer a request carries is bounded by the column it ends in (or by int8 where it only
# meets numpy and Python arithmetic), so an oversized value is a 422 naming its field, never a
# database or numpy overflow.
INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored as text, or None: PostgreSQL text holds no NUL character,
    and UTF-8 cannot encode a lone surrogate (a JSON escape such as \\ud800)."""
    if "\x00" in value:
        return "must not contain the NUL character (\\u0000)"
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        return "must not contain a lone surrogate (\\ud800-\\udfff): it is not valid Unicode text"
    return None


def _storable_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A string that can be stored: no NUL, no lone surrogate (lengths are set where it is used).
StorableStr = Annotated[str, AfterValidator(_storable_text)]


def storable_str(max_length: int, min_length: int = 0) -> Any:
    """StorableStr of min_length to max_length characters (a VARCHAR column's length)."""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length), AfterValidator(_storable_text)]


class ConfigError(ValueError):
    """A config broke a rule. `problems` holds (field, rule) pairs; str() names both."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {rule}" for field, rule in problems))


class AttentionConfig(BaseModel):
    """One attention problem. Field names are the public interface (REST, CLI, DB, reproducers)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    dtype: Dtype
    g: int = Field(ge=1, le=INT4_MAX)
    seq_len_q: int = Field(ge=1, le=INT4_MAX)
    seq_len_k: int = Field(ge=1, le=INT4_MAX)
    num_heads_q: int = Field(ge=1, le=INT4_MAX)
    num_heads_kv: int = Field(ge=1, le=INT4_MAX)
    head_dim_qk: int = Field(ge=1, le=MAX_HEAD_DIM)
    head_dim_v: int = Field(ge=1, le=MAX_HEAD_DIM)
    with_attn_scale: bool = True
    with_attn_bias: bool = False
    causal: bool = False
    prefix_offset: list[Annotated[int, Field(le=INT4_MAX)]] | None = None
    current_seq_len: list[Annotated[int, Field(le=INT4_MAX)]] | None = None
    trans_q: bool = False
    trans_k: bool = False
    trans_v: bool = False
    trans_o: bool = False
    return_lse: bool = False
    split_kv: int = Field(default=1, ge=1, le=INT4_MAX)
    rms_threshold: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    data_seed: int = Field(default=0, ge=0, le=INT8_MAX)
    # The shape of the input values (attnconfig.regimes); "normal" is left out of the
    # canonical dict, so a config without the field keeps its bytes and content hash.
    data_regime: Regime = DEFAULT_REGIME

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "AttentionConfig":
        problems = cross_field_problems(self)
        if problems:
            # pydantic wraps a ValueError; the CLI and API unwrap it through parse_config.
            raise ValueError(ConfigError(problems))
        return self

    # Derived quantities used by every layer -------------------------------------------------
    @property
    def gqa_ratio(self) -> int:
        return self.num_heads_q // self.num_heads_kv

    def last_valid_key(self, b: int) -> int:
        """L_b of docs/spec.md §3: the inclusive index of the last key batch entry b may see."""
        if self.current_seq_len is not None:
            return self.current_seq_len[b]
        return self.seq_len_k - 1

    def to_dict(self) -> dict[str, Any]:
        """Every field, but `data_regime` only when it is not the default: stored configs,
        reproducers and content hashes of configs drawn before the field existed stay the same."""
        d = self.model_dump()
        if d["data_regime"] == DEFAULT_REGIME:
            del d["data_regime"]
        return d

    def content_hash(self) -> str:
        """Stable across processes and versions: sha256 of the canonical JSON (to_json)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:32]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def to_compact_json(self) -> str:
        """The fields a reader needs: the required ones, those off their defaults, and the data
        seed (which inputs). parse_config of it gives this config back; reproducers carry it."""
        d = {k: v for k, v in self.to_dict().items()
             if k == "data_seed" or type(self).model_fields[k].is_required() or v != type(self).model_fields[k].default}
        return json.dumps(d, separators=(",", ":"))


def cross_field_problems(c: AttentionConfig) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if c.num_heads_q % c.num_heads_kv:
        problems.append(("num_heads_q", f"num_heads_q={c.num_heads_q} is not a multiple of num_heads_kv={c.num_heads_kv}"))
    if c.prefix_offset is not None:
        if not c.causal:
            problems.append(("prefix_offset", "prefix_offset requires causal=true"))
        if len(c.prefix_offset) != c.g:
            problems.append(("prefix_offset", f"prefix_offset has {len(c.prefix_offset)} entries, expected g={c.g}"))
        if any(p < 0 for p in c.prefix_offset):
            problems.append(("prefix_offset", "prefix_offset entries must be >= 0"))
    if c.current_seq_len is not None:
        if len(c.current_seq_len) != c.g:
            problems.append(("current_seq_len", f"current_seq_len has {len(c.current_seq_len)} entries, expected g={c.g}"))
        bad = [v for v in c.current_seq_len if not 0 <= v <= c.seq_len_k - 1]
        if bad:
            problems.append(("current_seq_len", f"current_seq_len entries must be in [0, seq_len_k-1={c.seq_len_k - 1}], got {bad[0]}"))
    if c.split_kv > 1 and not c.return_lse:
        problems.append(("split_kv", f"split_kv={c.split_kv} > 1 requires return_lse=true"))
    return problems


def _loc(err: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "config"


def parse_config(obj: Mapping[str, Any] | AttentionConfig | str) -> AttentionConfig:
    """Build a config from a dict (or JSON text), raising ConfigError naming field and rule."""
    if isinstance(obj, AttentionConfig):
        return obj
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise ConfigError([("config", f"not valid JSON: {exc}")]) from None
    if not isinstance(obj, Mapping):
        raise ConfigError([("config", "must be a JSON object")])
    try:
        return AttentionConfig.model_validate(dict(obj))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None


def validation_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Flatten pydantic's errors into (field, rule) pairs, unwrapping our cross-field rules."""
    problems: list[tuple[str, str]] = []
    for err in exc.errors():
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, ValueError) and inner.args and isinstance(inner.args[0], ConfigError):
            problems.extend(inner.args[0].problems)
            continue
        field = _loc(err)
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f"{field}={value!r}: "
        problems.append((field, f"{shown}{err['msg']}"))
    return problems
