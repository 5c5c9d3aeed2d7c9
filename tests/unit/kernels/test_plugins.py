"""Kernel plug-ins in this process: the interface's checks, naming a kernel, and torch's SDPA
(math and flash on the CPU) swept through the same runner and gates as the project's kernels."""
from __future__ import annotations

import json
import shlex

import ml_dtypes
import numpy as np
import pytest

from attnconfig import parse_config
from kernels.errors import NotApplicable, PluginError
from kernels.plugins import KernelSpecError, is_trusted, kernel_backend, parse_kernel
from kernels.plugins.adapter import PluginBackend
from kernels.plugins.interface import as_run_output, reason_parts
from reference import make_inputs
from sweeps.runner import run_config

BASE = dict(dtype="f16", g=2, seq_len_q=3, seq_len_k=70, num_heads_q=4, num_heads_kv=2, head_dim_qk=32, head_dim_v=32,
            with_attn_scale=True, with_attn_bias=False, causal=False, prefix_offset=None, current_seq_len=None,
            trans_q=False, trans_k=False, trans_v=False, trans_o=False, return_lse=False, split_kv=1, data_seed=7)


def config(**changes):
    return parse_config({**BASE, **changes})


def test_a_kernel_is_named_five_ways(tmp_path):
    assert parse_kernel("attnsweep").kind == "attnsweep"
    assert parse_kernel("torch-sdpa:cudnn").kind == "shipped"
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    assert parse_kernel(f"so:{lib}").text == f"so:{lib}"
    source = tmp_path / "k.py"
    source.write_text("")
    assert parse_kernel(f"{source}:KERNEL") == parse_kernel(f"{source}:KERNEL")
    assert parse_kernel(f"{source}:KERNEL").kind == "file"
    assert parse_kernel("some.module:Kernel").kind == "module"
    with pytest.raises(KernelSpecError, match="kernel: 'no-such-kernel' is no kernel here: name one of attnsweep"):
        parse_kernel("no-such-kernel")
    with pytest.raises(KernelSpecError, match="no such shared library"):
        parse_kernel(f"so:{tmp_path / 'missing.so'}")


def test_only_shipped_code_is_trusted(tmp_path):
    assert is_trusted("attnsweep") and is_trusted("torch-sdpa:math") and is_trusted("xformers-splitk")
    assert is_trusted("kernels.plugins.torch_sdpa:math")
    assert not is_trusted("some.module:Kernel")
    assert not is_trusted(f"so:{tmp_path / 'lib.so'}")
    assert not is_trusted(f"{tmp_path / 'k.py'}:KERNEL")


def test_a_plug_ins_answer_is_checked_before_the_gates():
    c = config(return_lse=True)
    out = np.zeros((2, 4, 3, 32), np.float32)
    lse = np.zeros((2, 4, 3), np.float32)
    with pytest.raises(PluginError, match="returned no log-sum-exp though the config asks for it"):
        as_run_output(c, out, 0.0)
    with pytest.raises(PluginError, match=r"returned out of shape \(2, 4, 32, 3\); the config's is \(2, 4, 3, 32\)"):
        as_run_output(c, (np.zeros((2, 4, 32, 3)), lse), 0.0)
    with pytest.raises(PluginError, match="returned lse of dtype <U1, not numbers"):
        as_run_output(c, (out, np.full((2, 4, 3), "x")), 0.0)
    with pytest.raises(PluginError, match="returned keys it has no place for: extra"):
        as_run_output(c, {"out": out, "lse": lse, "extra": 1}, 0.0)
    got = as_run_output(c, {"out": out, "lse": lse, "run_s": 0.25}, 1.0)
    assert got.out.dtype == np.float16 and got.lse.dtype == np.float32 and got.run_s == 0.25
    assert as_run_output(c, (out, lse), 1.5).run_s == 1.5


def test_torch_tensors_come_back_in_the_storage_type():
    import torch

    c = config(dtype="bf16")
    out = torch.full((2, 4, 3, 32), 1.5, dtype=torch.bfloat16)
    got = as_run_output(c, out, 0.0)
    assert got.out.dtype == np.dtype(ml_dtypes.bfloat16) and float(got.out[0, 0, 0, 0]) == 1.5


def test_reason_parts():
    assert reason_parts("dtype_i8: no int8 path") == ("dtype_i8", "no int8 path")
    assert reason_parts("I cannot") == ("unsupported", "I cannot")
    assert reason_parts("a" * 80 + ": long") == ("unsupported", "a" * 80 + ": long")


class Broken:
    name, version, device = "broken", "0", "cpu"

    def __init__(self, where):
        self.where = where

    def supports(self, c):
        if self.where == "supports":
            raise KeyError("head_dim")
        return None

    def run(self, c, inputs):
        raise RuntimeError("the kernel's own bug\nsecond line")


@pytest.mark.parametrize("where, detail", [
    ("supports", "kernel broken: supports() raised KeyError: 'head_dim'"),
    ("run", "kernel broken: run() raised RuntimeError: the kernel's own bug"),
])
def test_a_plug_in_that_raises_is_an_error_of_one_line(where, detail):
    result = run_config(config(), PluginBackend(Broken(where), "tests:Broken"))
    assert (result.outcome, result.detail) == ("error", detail)
    assert (result.kernel, result.kernel_version, result.kernel_spec) == ("broken", "0", "tests:Broken")


SDPA_CASES = {
    "gqa": {},
    "causal": dict(causal=True),
    "causal_prefix": dict(causal=True, prefix_offset=[5, 40]),
    "kv_cache": dict(seq_len_q=1, current_seq_len=[3, 66]),
    "bias": dict(with_attn_bias=True, causal=True, prefix_offset=[1, 2]),
    "layouts": dict(trans_q=True, trans_k=True, trans_v=True, trans_o=True),
    "bf16_dims": dict(dtype="bf16", head_dim_qk=24, head_dim_v=40),
    "f32_unscaled": dict(dtype="f32", with_attn_scale=False),
}


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_torch_sdpa_math_passes_the_gates_on_the_cpu(case):
    backend = kernel_backend("torch-sdpa:math", "cpu")
    result = run_config(config(**SDPA_CASES[case]), backend)
    assert result.outcome == "pass", result.detail
    assert result.kernel == "torch-sdpa:math" and result.kernel_version.startswith("torch ")
    assert result.variant == "torch-sdpa:math" and result.block_n == 32


@pytest.mark.parametrize("case", ["gqa", "causal", "kv_cache"])
def test_torch_sdpa_flash_returns_the_lse_the_gates_check(case):
    backend = kernel_backend("torch-sdpa:flash", "cpu")
    result = run_config(config(return_lse=True, split_kv=2, **SDPA_CASES[case]), backend)
    assert result.outcome == "pass", result.detail
    assert result.metrics["lse_max_abs"] is not None


def test_torch_sdpa_says_why_not():
    math = kernel_backend("torch-sdpa:math", "cpu")
    flash = kernel_backend("torch-sdpa:flash", "cpu")
    cudnn = kernel_backend("torch-sdpa:cudnn", "cpu")
    cases = [(math, config(dtype="i8"), "dtype_i8"), (math, config(return_lse=True), "no_lse"),
             (flash, config(with_attn_bias=True), "bias"), (flash, config(head_dim_v=16), "head_dims_differ"),
             (flash, config(causal=True, prefix_offset=[3, 3]), "causal_prefix"), (cudnn, config(), "device_cpu")]
    for backend, c, reason in cases:
        result = run_config(c, backend)
        assert (result.outcome, result.not_applicable_reason) == ("not_applicable", reason), result.detail
    with pytest.raises(NotApplicable):
        flash.prepare(config(with_attn_bias=True))


def test_a_reproducer_names_the_kernel_and_reproduces_the_verdict():
    from typer.testing import CliRunner

    from cli.main import app

    result = run_config(config(causal=True, prefix_offset=[0, 9]), kernel_backend("torch-sdpa:math", "cpu"))
    words = shlex.split(result.reproducer)
    assert words[:5] == ["attnsweep", "verify", "--kernel", "torch-sdpa:math", "--backend"]
    done = CliRunner().invoke(app, words[1:])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("pass: ")   # verify's one-line verdict
    done = CliRunner().invoke(app, [*words[1:], "--json"])
    answer = json.loads(done.stdout)
    assert (answer["outcome"], answer["kernel"]) == ("pass", "torch-sdpa:math")
    ours = run_config(config(), kernel_backend("attnsweep", "cpu"))
    assert "--kernel" not in ours.reproducer and ours.kernel == "attnsweep" and ours.kernel_version


def test_defects_belong_to_the_project_s_own_kernels():
    with pytest.raises(ValueError, match="defects: the defect switches are compiled into attnsweep's own kernels"):
        kernel_backend("torch-sdpa:math", "cpu", frozenset({"causal_off_by_one"}))


def test_inputs_stay_as_drawn():
    c = config(trans_k=True)
    inputs = make_inputs(c)
    before = inputs["k"].copy()
    run_config(c, kernel_backend("torch-sdpa:math", "cpu"))
    assert np.array_equal(inputs["k"], before)
