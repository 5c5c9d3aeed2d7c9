"""Every docs/spec.md §1 rule rejects with the field and the rule; the content hash is stable."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnconfig import ConfigError, parse_config
from attnconfig.footprint import splitkv_extra_bytes

BASE = dict(dtype="bf16", g=2, seq_len_q=3, seq_len_k=40, num_heads_q=8, num_heads_kv=4, head_dim_qk=64, head_dim_v=32)


@pytest.mark.parametrize(
    "patch, field, rule",
    [
        ({"num_heads_q": 6}, "num_heads_q", "num_heads_q=6 is not a multiple of num_heads_kv=4"),
        ({"split_kv": 4}, "split_kv", "split_kv=4 > 1 requires return_lse=true"),
        ({"prefix_offset": [0, 1]}, "prefix_offset", "requires causal=true"),
        ({"causal": True, "prefix_offset": [0]}, "prefix_offset", "expected g=2"),
        ({"current_seq_len": [0, 40]}, "current_seq_len", "[0, seq_len_k-1=39], got 40"),
        ({"current_seq_len": [1]}, "current_seq_len", "expected g=2"),
        ({"g": 0}, "g", "greater than or equal to 1"),
        ({"head_dim_v": 1025}, "head_dim_v", "less than or equal to 1024"),
        ({"dtype": "f64"}, "dtype", "'f16', 'bf16', 'f32' or 'i8'"),
        ({"causal": 1}, "causal", "valid boolean"),
        ({"rms_threshold": 0}, "rms_threshold", "greater than 0"),
        ({"data_seed": -1}, "data_seed", "greater than or equal to 0"),
        ({"colour": "red"}, "colour", "Extra inputs are not permitted"),
    ],
)
def test_invalid_config_names_field_and_rule(patch, field, rule):
    with pytest.raises(ConfigError) as err:
        parse_config({**BASE, **patch})
    fields = [f for f, _ in err.value.problems]
    assert field in fields
    assert rule in str(err.value)
    assert str(err.value).startswith(f"{field}:") or f"; {field}:" in str(err.value)


def test_missing_field_is_named():
    cfg = dict(BASE)
    del cfg["seq_len_k"]
    with pytest.raises(ConfigError, match="seq_len_k: .*Field required"):
        parse_config(cfg)


def test_not_json_and_not_object():
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config("{dtype")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        parse_config("[1, 2]")


def test_content_hash_is_stable_across_processes_and_key_order():
    c = parse_config(BASE)
    reordered = parse_config(json.dumps(dict(reversed(list(BASE.items())))))
    assert c.content_hash() == reordered.content_hash()
    code = f"from attnconfig import parse_config; print(parse_config({BASE!r}).content_hash())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == c.content_hash()
    assert parse_config({**BASE, "data_seed": 1}).content_hash() != c.content_hash()


def test_derived_values():
    c = parse_config({**BASE, "current_seq_len": [0, 17], "return_lse": True, "split_kv": 8})
    assert c.gqa_ratio == 2
    assert [c.last_valid_key(0), c.last_valid_key(1)] == [0, 17]
    assert parse_config(BASE).last_valid_key(1) == 39
    assert splitkv_extra_bytes(c) == 8 * 2 * 8 * 3 * (32 + 1) * 4
    assert splitkv_extra_bytes(parse_config(BASE)) == 0
