"""The kernel plug-in interface: what a kernel under test is, and how its answers are checked.

A plug-in is any object with
- `name` (str) and `version` (str: a package version or a digest of its source);
- `device` (str, default "cpu"): where it runs ("cpu", "cuda", "hip");
- `supports(config) -> None | str`: None when it runs the config, else why not, as
  "reason: detail" (the reason, at most 64 characters, is what sweeps count as `not_applicable`);
- `run(config, inputs)`: the config's output. `inputs` is reference.inputs.make_inputs(config):
  read-only numpy arrays in the logical layouts of docs/spec.md §1 (q [g, Hq, Sq, Dqk], k, v,
  bias [g, Hq, Sq, Sk]; i8: quant_scale and quant_zero_point). It returns a KernelOutput, a
  tuple (out, lse, o_partials, lse_partials) with the later items optional, or the output
  alone; numpy arrays or torch tensors. LSE is required where the config asks for it
  (`return_lse`): a kernel that returns none says so in supports().
- optionally `block_n` (the key tile its partials are cut at, default 32), `run_s` in its
  KernelOutput (kernel time it measured, e.g. with device events; default: run()'s wall time),
  `device_info()` (a dict of kernels.backends.base.DeviceInfo fields) and `close()`.

Whatever it returns is checked before the reference and the gates see it (`as_run_output`):
shapes against the config, numbers only; a broken answer is a PluginError, the config's `error`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from attnconfig import AttentionConfig
from kernels.errors import PluginError
from kernels.backends.base import RunOutput

REASON_CHARS = 64    # config_runs.not_applicable_reason
LINE_CHARS = 500     # a plug-in's one-line message, as stored


@runtime_checkable
class KernelPlugin(Protocol):
    name: str
    version: str

    def supports(self, config: AttentionConfig) -> str | None: ...

    def run(self, config: AttentionConfig, inputs: Mapping[str, Any]) -> Any: ...


@dataclass
class KernelOutput:
    """What a plug-in's run returns: logical layouts, host or device arrays."""

    out: Any
    lse: Any = None
    o_partials: Any = None
    lse_partials: Any = None
    run_s: float | None = None


def one_line(text: Any, limit: int = LINE_CHARS) -> str:
    """A message as a result stores it: its first non-empty line, bounded."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 4] + " ..."


def reason_parts(why: str) -> tuple[str, str]:
    """("reason", "detail") of a supports() answer "reason: detail"; a reason of at most 64
    characters without spaces (what is counted), the rest as detail."""
    text = one_line(why)
    head, sep, rest = text.partition(":")
    reason = head.strip().replace(" ", "_")
    if not sep or not reason or len(reason) > REASON_CHARS:
        return "unsupported", text
    return reason, rest.strip()


def _host(name: str, value: Any) -> np.ndarray:
    """A numpy copy of an array the plug-in returned (torch tensors too, bf16 included)."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        import torch

        tensor = value.detach().to("cpu")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.numpy()
    try:
        return np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is no array is the plug-in's mistake
        raise PluginError(f"returned {name} as {type(value).__name__}, not an array") from None


def _unpack(returned: Any) -> KernelOutput:
    if isinstance(returned, (KernelOutput, RunOutput)):
        return KernelOutput(returned.out, returned.lse, returned.o_partials, returned.lse_partials,
                            getattr(returned, "run_s", None))
    if isinstance(returned, Mapping):
        unknown = sorted(set(returned) - {"out", "lse", "o_partials", "lse_partials", "run_s"})
        if unknown:
            raise PluginError(f"returned keys it has no place for: {', '.join(map(str, unknown))}")
        return KernelOutput(returned.get("out"), returned.get("lse"), returned.get("o_partials"),
                            returned.get("lse_partials"), returned.get("run_s"))
    if isinstance(returned, (tuple, list)):
        if not 1 <= len(returned) <= 4:
            raise PluginError(f"returned {len(returned)} items; expected (out, lse, o_partials, lse_partials), "
                              "the later ones optional")
        return KernelOutput(*returned)
    return KernelOutput(returned)


def as_run_output(config: AttentionConfig, returned: Any, wall_s: float) -> RunOutput:
    """The RunOutput of a plug-in's answer, cast to the storage types of docs/spec.md §1; a
    PluginError naming what is wrong (missing, wrong shape, not numbers)."""
    from reference.inputs import output_dtypes

    got = _unpack(returned)
    c = config
    out_dtype, lse_dtype = output_dtypes(c)
    out_shape, lse_shape = (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), (c.g, c.num_heads_q, c.seq_len_q)
    if got.out is None:
        raise PluginError("returned no output")
    if c.return_lse and got.lse is None:
        raise PluginError("returned no log-sum-exp though the config asks for it (return_lse); "
                          "a kernel without one says so in supports()")
    if (got.o_partials is None) != (got.lse_partials is None):
        raise PluginError("returned one of o_partials and lse_partials without the other")
    arrays: dict[str, np.ndarray | None] = {}
    wanted = {"out": (out_shape, out_dtype), "lse": (lse_shape, lse_dtype),
              "o_partials": ((c.split_kv, *out_shape), np.dtype(np.float32)),
              "lse_partials": ((c.split_kv, *lse_shape), np.dtype(np.float32))}
    for name, (shape, dtype) in wanted.items():
        value = getattr(got, name)
        if value is None or (name == "lse" and not c.return_lse):
            arrays[name] = None
            continue
        array = _host(name, value)
        if array.shape != shape:
            raise PluginError(f"returned {name} of shape {tuple(array.shape)}; the config's is {shape}")
        if array.dtype.kind not in "fiu" and str(array.dtype) != "bfloat16":
            raise PluginError(f"returned {name} of dtype {array.dtype}, not numbers")
        arrays[name] = np.ascontiguousarray(array.astype(dtype, copy=False))
    run_s = got.run_s if isinstance(got.run_s, (int, float)) and got.run_s >= 0 else wall_s
    return RunOutput(out=arrays["out"], lse=arrays["lse"], o_partials=arrays["o_partials"],
                     lse_partials=arrays["lse_partials"], run_s=float(run_s))
