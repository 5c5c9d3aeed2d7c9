"""The sweep-request options `run`, `submit` and `sample` share, declared once; and turning the
CLI's strings into a SweepSpec (the same model the REST API validates)."""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import typer

from sweeps.spec import SweepSpec, SweepSpecError, parse_ranges, parse_sweep_spec

# Request fields whose option is not the field's name with dashes (docs/spec.md §8).
OPTION_NAMES = {"data_regimes": "--regimes", "coverage_prior_sweeps": "--coverage-prior"}


def parse_regimes(text: str) -> dict[str, float] | list[str]:
    """A `--regimes` value: "normal=0.5,sink=0.1" (shares) or "normal,sink" (equal shares).
    Names and shares are checked by the request model (sweeps.regime_mix); the form here."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise SweepSpecError([("data_regimes", f"{text!r}: name at least one regime, e.g. normal=0.5,sink=0.5 "
                                               "or normal,sink")])
    shared = ["=" in t for t in items]
    if not any(shared):
        return items
    if not all(shared):
        raise SweepSpecError([("data_regimes", f"{text!r}: give every regime a share (NAME=SHARE) or none "
                                               "(equal shares)")])
    mix: dict[str, float] = {}
    for item in items:
        name, _, share = (p.strip() for p in item.partition("="))
        try:
            value = float(share)
        except ValueError:
            raise SweepSpecError([("data_regimes", f"{item!r}: a share must be a number, e.g. {name}=0.1")]) from None
        if name in mix:
            raise SweepSpecError([("data_regimes", f"{text!r}: {name} given twice")])
        mix[name] = value
    return mix


def build_spec(*, dtypes: str, ranges: list[str], regimes: str | None = None, **fields: Any) -> SweepSpec:
    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    if regimes is not None:
        fields["data_regimes"] = parse_regimes(regimes)
    return parse_sweep_spec({"dtypes": names, "ranges": parse_ranges(ranges), **fields})


def defects_help() -> str:
    from kernels.backends.base import DEFECTS

    return ("compile a known bug into the kernels, to show that sweeps catch it (repeatable); one of: "
            + "; ".join(f"{name} ({what})" for name, what in DEFECTS.items()))


def _known_defects(names: list[str]) -> list[str]:
    # Checked while the options are parsed: an unknown name is a usage mistake before any
    # database is opened or backend started.
    from kernels.backends.base import DEFECTS

    unknown = [n for n in names if n not in DEFECTS]
    if unknown:
        raise typer.BadParameter(f"unknown defect {unknown[0]!r}; known: {', '.join(DEFECTS)}")
    return names


def defect_option() -> Any:
    return typer.Option([], "--defect", help=defects_help(), callback=_known_defects)


# (parameter, annotation, option): sweep request fields that are CLI options of the same name
# (docs/spec.md §8); `range_` is the request's ranges.
_SPEC = [
    ("samples", int, typer.Option(50, "--samples", help="configs to run (accepted by every prefilter)")),
    ("seed", Optional[int], typer.Option(None, "--seed", help="sweep seed (default: the ISO week number)")),
    ("dtypes", str, typer.Option("f16,bf16,f32,i8", "--dtypes", help="comma-separated dtypes to sample")),
    ("backend", str, typer.Option("auto", "--backend", help="auto|cpu|cuda|hip|hostemu (auto: a usable GPU, else the cpu "
                                                            "emulation; hostemu: the kernel source run on the CPU)")),
    ("kernel", str, typer.Option("attnsweep", "--kernel", help="the kernel under test: attnsweep (the project's own, "
                                                                "on --backend), a plug-in `attnsweep kernels` lists, "
                                                                "module:attr, path/file.py:attr or so:PATH (docs/plugins.md)")),
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
    ("regimes", Optional[str], typer.Option(None, "--regimes", help="input data regimes to draw and their shares, e.g. "
                                                                    "normal=0.5,sink=0.1,outliers=0.4, or names for equal "
                                                                    "shares (default: normal 0.5, every other 0.1)")),
    ("coverage_guided", bool, typer.Option(False, "--coverage-guided", help="prefer draws that land in the least "
                                                                            "covered coverage cells")),
    ("coverage_prior_sweeps", int, typer.Option(0, "--coverage-prior", min=0, help="with --coverage-guided: the "
                                                "newest N finished sweeps of the store count as already covered")),
]
OPTION_FIELDS = tuple(name for name, _t, _o in _SPEC if name != "range_")


@dataclass(frozen=True)
class SweepOptions:
    """What the shared options said: the request's fields (as build_spec takes them) and the defects."""

    fields: dict[str, Any]
    defects: list[str] = field(default_factory=list)


def sweep_options(*, label: bool = True, defects: bool = True, prior: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the shared options to a command, which gets them as one `options: SweepOptions`
    (`prior`: --coverage-prior, for commands that read a store)."""
    chosen = [(n, t, o) for n, t, o in _SPEC if (label or n != "label") and (prior or n != "coverage_prior_sweeps")]
    if defects:
        chosen.append(("defect", list[str], defect_option()))

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
