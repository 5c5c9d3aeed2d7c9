"""`attnsweep.toml` at the root of a kernel repository: how to build its kernel and load it.

```toml
[kernel]
build = ["make", "-C", "kernel", "cpu"]   # optional: an argv list, run without a shell
plugin = "so:build/libsplitkv.so"         # or "path/file.py:attr", or "module:attr"
```

`plugin` names a plug-in as `--kernel` does (kernels/plugins/load.py), its paths relative to
the repository's root, which is also the Python path of `module:attr`. Nothing may point
outside the repository: no absolute path, no `..`, and only the characters of PATH_RE.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass

FILE_NAME = "attnsweep.toml"
MAX_BYTES = 64 << 10
MAX_ARGS, MAX_ARG_CHARS = 256, 4096
MAX_PLUGIN_CHARS = 500
PATH_RE = re.compile(r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
PLUGIN_FORMS = "so:PATH, PATH.py:attr or module:attr (paths relative to the repository's root)"


class ManifestError(ValueError):
    """attnsweep.toml breaks a rule; str() names the field and the rule."""


@dataclass(frozen=True)
class Manifest:
    build: tuple[str, ...] | None
    plugin: str

    @property
    def plugin_path(self) -> str | None:
        """The file the plug-in loads from, relative to the root (None for module:attr)."""
        if self.plugin.startswith("so:"):
            return self.plugin[3:]
        left, _, _ = self.plugin.rpartition(":")
        return left if left.endswith(".py") else None


def _relative(field: str, path: str) -> str:
    if path.startswith("/") or not PATH_RE.match(path) or any(p in (".", "..") for p in path.split("/")):
        raise ManifestError(f"{FILE_NAME}: {field}: {path!r} must be a path inside the repository: relative, "
                            "no '.' or '..' part, only letters, digits and _ . + - /")
    return path


def _plugin(value: object) -> str:
    field = "kernel.plugin"
    if not isinstance(value, str) or not value or len(value) > MAX_PLUGIN_CHARS:
        raise ManifestError(f"{FILE_NAME}: {field}: must be a string of 1 to {MAX_PLUGIN_CHARS} characters: "
                            f"{PLUGIN_FORMS}")
    if value.startswith("so:"):
        _relative(field, value[3:])
        return value
    left, sep, attr = value.rpartition(":")
    if sep and NAME_RE.match(attr):
        if left.endswith(".py"):
            _relative(field, left)
            return value
        if NAME_RE.match(left):
            return value
    raise ManifestError(f"{FILE_NAME}: {field}: {value!r} is none of {PLUGIN_FORMS}")


def _build(value: object) -> tuple[str, ...]:
    field = "kernel.build"
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise ManifestError(f"{FILE_NAME}: {field}: must be a non-empty list of strings (an argv, run without a "
                            "shell), e.g. [\"make\", \"-C\", \"kernel\"]")
    if len(value) > MAX_ARGS or any(not a or len(a) > MAX_ARG_CHARS or "\x00" in a for a in value):
        raise ManifestError(f"{FILE_NAME}: {field}: at most {MAX_ARGS} arguments, each 1 to {MAX_ARG_CHARS} "
                            "characters without NUL")
    return tuple(value)


def parse_manifest(data: bytes) -> Manifest:
    """The Manifest of attnsweep.toml's bytes. Raises ManifestError."""
    if len(data) > MAX_BYTES:
        raise ManifestError(f"{FILE_NAME}: larger than {MAX_BYTES} bytes")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError(f"{FILE_NAME}: is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{FILE_NAME}: is not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"kernel"})
    if unknown:
        raise ManifestError(f"{FILE_NAME}: {unknown[0]}: unknown table or key; the file holds [kernel] only")
    kernel = doc.get("kernel")
    if not isinstance(kernel, dict):
        raise ManifestError(f"{FILE_NAME}: kernel: the [kernel] table is required (plugin, and build if it builds)")
    unknown = sorted(set(kernel) - {"build", "plugin"})
    if unknown:
        raise ManifestError(f"{FILE_NAME}: kernel.{unknown[0]}: unknown key; [kernel] takes build and plugin")
    if "plugin" not in kernel:
        raise ManifestError(f"{FILE_NAME}: kernel.plugin: required: {PLUGIN_FORMS}")
    build = _build(kernel["build"]) if "build" in kernel else None
    return Manifest(build, _plugin(kernel["plugin"]))
