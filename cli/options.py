"""The sweep-request options `run`, `submit` and `sample` share, declared once; and turning the
CLI's strings into a SweepSpec (the same model the REST API validates)."""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import typer

from sweeps.spec import SweepSpec, parse_ranges, parse_sweep_spec


def build_spec(*, dtypes: str, ranges: list[str], **fields: Any) -> SweepSpec:
    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    return parse_sweep_spec({"dtypes": names, "ranges": parse_ranges(ranges), **fields})


def defects_help() -> str:
    from kernels.backends.base import DEFECTS

    return ("compile a known bug into the kernels, to show that sweeps catch it (repeatable); one of: "
            + "; ".join(f"{name} ({what})" for name, what in DEFECTS.items()))


# (parameter, annotation, option): sweep request fields that are CLI options of the same name
# (docs/spec.md §8); `range_` is the request's ranges.
_SPEC = [
    ("samples", int, typer.Option(50, "--samples", help="configs to run (accepted by every prefilter)")),
    ("seed", Optional[int], typer.Option(None, "--seed", help="sweep seed (default: the ISO week number)")),
    ("dtypes", str, typer.Option("f16,bf16,f32,i8", "--dtypes", help="comma-separated dtypes to sample")),
    ("backend", str, typer.Option("auto", "--backend", help="auto|cpu|cuda|hip|hostemu (auto: a usable GPU, else the cpu "
                                                            "emulation; hostemu: the kernel source run on the CPU)")),
    ("label", Optional[str], typer.Option(None, "--label", help="a free-text name stored with the sweep (filters and the "
                                                                "dashboard show it)")),
    ("max_tokens", int, typer.Option(16384, "--max-tokens", help="prefilter: a config is dropped when "
                                                                 "max(seq_len_q, seq_len_k) * g exceeds this")),
    ("splitkv_extra_bytes_limit", Optional[int], typer.Option(None, "--splitkv-extra-bytes-limit",
                                                              help="bytes; default: device memory // 8 in [1, 8] GiB, "
                                                                   "1.5 GiB without a GPU")),
    ("reference_flops_limit", float, typer.Option(2e10, "--reference-flops-limit", help="prefilter: most floating-point "
                                                                                        "operations the host reference may spend on a config")),
    ("reference_bytes_limit", int, typer.Option(1 << 30, "--reference-bytes-limit", help="prefilter: most bytes the host "
                                                                                          "reference may hold for a config")),
    ("range_", list[str], typer.Option([], "--range", help="override a sampled range, e.g. g=1:64 (repeatable)")),
]
OPTION_FIELDS = tuple(name for name, _t, _o in _SPEC if name != "range_")


@dataclass(frozen=True)
class SweepOptions:
    """What the shared options said: the request's fields (as build_spec takes them) and the defects."""

    fields: dict[str, Any]
    defects: list[str] = field(default_factory=list)


def sweep_options(*, label: bool = True, defects: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the shared options to a command, which gets them as one `options: SweepOptions`."""
    chosen = [(n, t, o) for n, t, o in _SPEC if label or n != "label"]
    if defects:
        chosen.append(("defect", list[str], typer.Option([], "--defect", help=defects_help())))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for name, p in inspect.signature(command, eval_str=True).parameters.items() if name != "options"]
        shared = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=o, annotation=t) for n, t, o in chosen]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            said = {n: kwargs.pop(n) for n, _t, _o in chosen}
            said["ranges"] = said.pop("range_")
            return command(**kwargs, options=SweepOptions(said, said.pop("defect", [])))

        # typer reads a command's options from its signature: these, then the command's own.
        wrapper.__signature__ = inspect.Signature(shared + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
        wrapper.__annotations__ = {}
        return wrapper

    return decorate
