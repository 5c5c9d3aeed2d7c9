"""Kernel plug-ins: the kernel under test, apart from the runtimes of the project's own kernels.

interface.py is what a plug-in is (name, version, supports, run) and how its answers are
checked; adapter.py wraps one as a kernels.backends.base.Backend, so sweeps, gates, triage and
the store run any kernel as they run ours; load.py finds and loads what `--kernel` names
(the shipped plug-ins, entry points of group `attnsweep.kernels`, module:attr,
path/file.py:attr, so:PATH); torch_sdpa.py, xformers_splitk.py and c_abi.py are the plug-ins
that ship. Confinement of the ones that did not ship is isolation/'s (isolation.confined).
"""
from __future__ import annotations

from kernels.backends.base import Backend, BackendUnavailable
from kernels.plugins.interface import KernelOutput, KernelPlugin, one_line
from kernels.plugins.load import (DEFAULT_KERNEL, GROUP, SHIPPED, KernelSpec, KernelSpecError, confinement_paths,
                                  discover, is_trusted, load_plugin, parse_kernel, tree_spec)
from kernels.source import KernelSource

__all__ = ["DEFAULT_KERNEL", "GROUP", "SHIPPED", "KernelOutput", "KernelPlugin", "KernelSpec", "KernelSpecError",
           "confinement_paths", "discover", "is_trusted", "kernel_backend", "load_plugin", "parse_kernel",
           "tree_spec"]


def kernel_backend(kernel: str = DEFAULT_KERNEL, backend: str = "auto",
                   defects: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
                   source: KernelSource | None = None) -> Backend:
    """The Backend that runs `kernel` in this process: the project's own kernels on the runtime
    `backend` (kernels.get_backend), or the plug-in wrapped (adapter.PluginBackend).

    Raises BackendUnavailable when the plug-in cannot load here, KernelSpecError for a name
    that is no kernel, ValueError for defect switches or a source bundle with a plug-in (both
    belong to the project's own kernels)."""
    from kernels.backends import get_backend

    spec = parse_kernel(kernel)
    if spec.is_default:
        return get_backend(backend, defects=defects, source=source)
    if defects:
        raise ValueError(f"defects: the defect switches are compiled into attnsweep's own kernels; kernel "
                         f"{kernel} has none (a plug-in ships its own switch, docs/plugins.md)")
    if source is not None:
        raise ValueError(f"kernel {kernel}: a source bundle (kernels/src of a commit) is the project's own kernels")
    from kernels.plugins.adapter import PluginBackend

    try:
        plugin = load_plugin(spec.text, backend)
    except KernelSpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - an import that fails, a library that does not load
        raise BackendUnavailable(f"kernel {kernel}: {one_line(f'{type(exc).__name__}: {exc}')}") from None
    return PluginBackend(plugin, spec.text, version=spec.version or None)
