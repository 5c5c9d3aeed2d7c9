"""Which kernel `--kernel` names, found and loaded (docs/plugins.md).

A kernel is named one of five ways:
- `attnsweep` (the default): the project's own kernels, on the runtime `--backend` picks;
- a plug-in that ships with attnsweep (SHIPPED: `torch-sdpa:math|flash|efficient|cudnn`,
  `xformers-splitk`);
- an entry point of the group `attnsweep.kernels` of an installed package (`pip install` makes
  its kernels appear in `attnsweep kernels`);
- `module:attr` (an importable module) or `path/to/file.py:attr`;
- `so:PATH`: a shared library exporting the C function of kernels/plugins/attnsweep_kernel.h,
  loaded by the shipped C-ABI plug-in (c_abi.py);
- `commit:SHA`: the plug-in the attnsweep.toml of that commit of ATTNSWEEP_KERNEL_REPO names
  (the CI webhook's sweeps), which a worker builds (kernelsrc/build.py) and runs as
- `tree:VERSION:ROOT|PLUGIN`: a built tree, ROOT, and its plug-in PLUGIN in one of the forms
  above with paths relative to ROOT (ROOT is also the Python path of module:attr), stored
  under VERSION (the commit) instead of the version the plug-in says.
The attribute is a plug-in object (kernels/plugins/interface.py), a class, or a function that
returns one.

Trust: the project's own kernels and the shipped plug-ins are the image's code and run in the
worker's process; anything else (an entry point of another package, a module or file, a
library's code) did not ship and runs confined (isolation/, `is_trusted`).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

DEFAULT_KERNEL = "attnsweep"
GROUP = "attnsweep.kernels"
MAX_SPEC_CHARS = 1000
# The plug-ins that ship: name -> (module, factory); the factory takes the backend asked for.
SHIPPED: dict[str, tuple[str, str]] = {
    **{f"torch-sdpa:{b}": ("kernels.plugins.torch_sdpa", b) for b in ("math", "flash", "efficient", "cudnn")},
    "xformers-splitk": ("kernels.plugins.xformers_splitk", "plugin"),
}
# The project's own top-level packages: a module:attr inside them is shipped code.
OWN_PACKAGES = frozenset({"kernels", "reference", "attnconfig", "sweeps", "settings", "isolation"})
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ATTR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class KernelSpecError(ValueError):
    """A `kernel` that names nothing loadable; str() names the field and the rule."""


@dataclass(frozen=True)
class KernelSpec:
    """A parsed `--kernel`: its kind and, for paths, the absolute path (the form stored and sent)."""

    kind: str          # attnsweep | shipped | entry_point | module | file | so | commit | tree
    text: str          # the canonical spec: paths made absolute
    target: str = ""   # module or file path; a commit's id; a tree's root
    attr: str = ""     # a tree's plug-in, relative to its root
    version: str = ""  # a tree's version (its commit)

    @property
    def is_default(self) -> bool:
        return self.kind == "attnsweep"


def entry_points() -> dict[str, metadata.EntryPoint]:
    """The installed `attnsweep.kernels` entry points by name (the first of a repeated name)."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def parse_kernel(text: str, *, check: bool = True) -> KernelSpec:
    """The KernelSpec of `text`. With `check`, a path must exist and an entry point be installed.
    Raises KernelSpecError."""
    if not isinstance(text, str) or not text.strip():
        raise KernelSpecError("kernel: must be a non-empty name (attnsweep kernels lists them)")
    text = text.strip()
    if len(text) > MAX_SPEC_CHARS or "\x00" in text:
        raise KernelSpecError(f"kernel: at most {MAX_SPEC_CHARS} characters, no NUL")
    if text == DEFAULT_KERNEL:
        return KernelSpec("attnsweep", text)
    if text in SHIPPED:
        return KernelSpec("shipped", text, *SHIPPED[text])
    if text.startswith("commit:"):
        if not _COMMIT.match(text[7:]):
            raise KernelSpecError("kernel: commit:SHA takes a full commit id (40 or 64 lower-case hex digits)")
        return KernelSpec("commit", text, text[7:])
    if text.startswith("tree:"):
        version, _, rest = text[5:].partition(":")
        root, sep, plugin = rest.rpartition("|")
        if not version or not sep or not os.path.isabs(root) or not plugin:
            raise KernelSpecError("kernel: tree:VERSION:ROOT|PLUGIN needs a version, an absolute root and a plug-in")
        spec = KernelSpec("tree", text, os.path.normpath(root), plugin, version[:64])
        _inner(spec, check)
        return spec
    if text.startswith("so:"):
        path = os.path.abspath(os.path.expanduser(text[3:]))
        if check and not os.path.isfile(path):
            raise KernelSpecError(f"kernel: so:{text[3:]}: no such shared library")
        return KernelSpec("so", f"so:{path}", path)
    left, sep, attr = text.rpartition(":")
    if sep and left.endswith(".py"):
        if not _ATTR.match(attr):
            raise KernelSpecError(f"kernel: {text!r}: after the file, ':attr' names an attribute (path/file.py:attr)")
        path = os.path.abspath(os.path.expanduser(left))
        if check and not os.path.isfile(path):
            raise KernelSpecError(f"kernel: {left}: no such file")
        return KernelSpec("file", f"{path}:{attr}", path, attr)
    if sep and _MODULE.match(left) and _ATTR.match(attr):
        return KernelSpec("module", text, left, attr)
    if check and text not in entry_points():
        names = sorted([DEFAULT_KERNEL, *SHIPPED, *entry_points()])
        raise KernelSpecError(f"kernel: {text!r} is no kernel here: name one of {', '.join(names)}, "
                              "or module:attr, path/file.py:attr, so:PATH")
    return KernelSpec("entry_point", text)


def _inner(spec: KernelSpec, check: bool = True) -> KernelSpec:
    """A tree's plug-in as its own spec: so:, path.py:attr made absolute under the root, or module:attr."""
    plugin = spec.attr
    if plugin.startswith("so:"):
        plugin = "so:" + os.path.join(spec.target, plugin[3:])
    else:
        left, sep, attr = plugin.rpartition(":")
        if sep and left.endswith(".py"):
            plugin = f"{os.path.join(spec.target, left)}:{attr}"
    inner = parse_kernel(plugin, check=check)
    if inner.kind not in ("so", "file", "module") or not (inner.kind == "module" or
                                                           inner.target.startswith(spec.target.rstrip("/") + "/")):
        raise KernelSpecError(f"kernel: {spec.text!r}: the plug-in must be so:PATH, PATH.py:attr or module:attr "
                              "inside its tree")
    return inner


def tree_spec(version: str, root: str, plugin: str) -> str:
    """The spec of a built tree's plug-in (`tree:VERSION:ROOT|PLUGIN`)."""
    return f"tree:{version}:{os.path.abspath(root)}|{plugin}"


def _module_of(spec: KernelSpec) -> tuple[str, str]:
    """(module, attr) of a module or entry-point spec."""
    if spec.kind == "entry_point":
        ep = entry_points().get(spec.text)
        if ep is None:
            raise KernelSpecError(f"kernel: entry point {spec.text!r} of group {GROUP} is not installed")
        module, _, attr = ep.value.partition(":")
        return module.strip(), attr.strip()
    return spec.target, spec.attr


def is_trusted(text: str) -> bool:
    """Whether the kernel is code that shipped with attnsweep (runs unconfined): its own
    kernels, the shipped plug-ins, a module:attr or an entry point inside its packages."""
    spec = parse_kernel(text, check=False)
    if spec.kind in ("attnsweep", "shipped"):
        return True
    if spec.kind in ("module", "entry_point"):
        try:
            module, _attr = _module_of(spec)
        except KernelSpecError:
            return False
        return module.split(".")[0] in OWN_PACKAGES
    return False


def confinement_paths(text: str) -> tuple[list[str], list[str]]:
    """(read-only binds, PYTHONPATH entries) a confined process needs to load the kernel: a
    file's folder, a library's folder, a module's package outside the interpreter's paths."""
    spec = parse_kernel(text, check=False)
    if spec.kind == "tree":   # the whole built tree, and it as the Python path
        return [spec.target], [spec.target]
    if spec.kind in ("file", "so"):
        return [os.path.dirname(spec.target)], ([os.path.dirname(spec.target)] if spec.kind == "file" else [])
    if spec.kind in ("module", "entry_point"):
        module, _attr = _module_of(spec)
        found = importlib.util.find_spec(module.split(".")[0])
        if found is not None and found.origin and found.origin not in ("built-in", "frozen"):
            origin = Path(found.origin).resolve()
            folder = origin.parent if found.submodule_search_locations else origin
            return [str(folder)], [str(folder.parent)]
    return [], []


def _resolve(obj: Any, attr: str) -> Any:
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _instance(obj: Any, what: str, backend: str | None) -> Any:
    """The plug-in object: `obj` itself, or what its class or factory makes."""
    if inspect.isclass(obj) or (callable(obj) and not (hasattr(obj, "run") and hasattr(obj, "supports"))):
        obj = obj(backend) if what == "shipped" else obj()
    missing = [a for a in ("name", "version", "supports", "run") if not hasattr(obj, a)]
    if missing:
        raise KernelSpecError(f"kernel: {what} gives {type(obj).__name__}, which lacks {', '.join(missing)} "
                              "(docs/plugins.md: name, version, supports(config), run(config, inputs))")
    return obj


def load_plugin(text: str, backend: str | None = None) -> Any:
    """The plug-in object `text` names, loaded in this process (confinement is the caller's:
    isolation.confined). `backend` is the runtime asked for; the shipped plug-ins take it (cpu
    or cuda for torch), others run on their own device. Raises KernelSpecError."""
    spec = parse_kernel(text)
    if spec.kind == "attnsweep":
        raise KernelSpecError("kernel: attnsweep is the project's own kernels, run through a backend (kernels.get_backend)")
    if spec.kind == "commit":
        raise KernelSpecError(f"kernel: {text}: a commit's kernel is built by a worker (kernelsrc/build.py) and "
                              "loaded from its tree")
    if spec.kind == "tree":
        if spec.target not in sys.path:
            sys.path.insert(0, spec.target)   # module:attr and the plug-in's imports of its tree
        return load_plugin(_inner(spec).text, backend)
    if spec.kind == "so":
        from kernels.plugins.c_abi import CAbiKernel

        return CAbiKernel(spec.target, backend)
    if spec.kind == "file":
        folder = os.path.dirname(spec.target)
        if folder not in sys.path:
            sys.path.insert(0, folder)   # the file's own imports of its neighbours
        name = "attnsweep_plugin_" + re.sub(r"\W", "_", Path(spec.target).stem)
        loader = importlib.util.spec_from_file_location(name, spec.target)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
        return _instance(_attr_of(module, spec.attr, text), "file", backend)
    if spec.kind == "shipped":
        module = importlib.import_module(spec.target)
        return _instance(getattr(module, spec.attr), "shipped", backend)
    module_name, attr = _module_of(spec)
    module = importlib.import_module(module_name)
    return _instance(_attr_of(module, attr, text), spec.kind, backend)


def _attr_of(module: Any, attr: str, text: str) -> Any:
    try:
        return _resolve(module, attr)
    except AttributeError:
        raise KernelSpecError(f"kernel: {text!r}: {module.__name__} has no attribute {attr!r}") from None


def discover() -> list[dict[str, Any]]:
    """Every kernel this installation names: [{name, kind, value, trusted}] (`attnsweep kernels`)."""
    rows = [{"name": DEFAULT_KERNEL, "kind": "attnsweep", "value": "kernels/src on --backend", "trusted": True}]
    rows += [{"name": n, "kind": "shipped", "value": f"{m}:{a}", "trusted": True} for n, (m, a) in SHIPPED.items()]
    for name, ep in sorted(entry_points().items()):
        dist = getattr(ep, "dist", None)
        rows.append({"name": name, "kind": "entry_point", "value": ep.value,
                     "package": f"{dist.name} {dist.version}" if dist is not None else "", "trusted": is_trusted(name)})
    return rows


