"""The kernel source a backend compiles: the entry file, the headers it may include, their hash.

A backend compiles either the workers' own kernels/src (local_source) or a
*source bundle*: kernels/src as it was at some commit of the kernel repository (kernelsrc/),
stored once, content-addressed by this hash. The compile cache keys binaries by the hash, so
two revisions never share a binary and one revision is compiled once per host.

The cpu backend does not compile; it emulates the kernels in numpy. What it can take from a
source is its defect switches (`defect_switches`): the `#define ATTN_DEFECT_*` / `#undef`
directives in the text, read line by line in order. The emulation does not preprocess:
a directive inside `#if` is counted whatever the condition, and a switch that names no
defect the emulation knows (kernels.backends.base.DEFECTS) is reported but cannot be emulated.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable, Mapping

ENTRY_FILE = "attention.hip"
SRC_DIR = Path(__file__).resolve().parent / "src"
HEADER_FILES = ("hip_compat.h",)   # what the GPU compilers read beside the entry file

_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(define|undef)[ \t]+ATTN_DEFECT_([A-Z0-9_]+)\b", re.M)


def source_digest(entry_name: str, entry_text: str, headers: Mapping[str, str]) -> str:
    """sha256 over the entry file, then the headers by name: name NUL text NUL each."""
    h = hashlib.sha256()
    for name, text in [(entry_name, entry_text), *sorted(headers.items())]:
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class KernelSource:
    """attention.hip and the headers handed to the compiler beside it (name -> text)."""

    entry_text: str
    headers: Mapping[str, str] = field(default_factory=dict)
    entry_name: str = ENTRY_FILE

    @cached_property
    def hash(self) -> str:
        return source_digest(self.entry_name, self.entry_text, self.headers)

    @property
    def files(self) -> dict[str, str]:
        """Every file by its name in kernels/src (what a bundle stores)."""
        return {self.entry_name: self.entry_text, **self.headers}

    @classmethod
    def from_files(cls, files: Mapping[str, str], entry_name: str = ENTRY_FILE) -> "KernelSource":
        """A bundle: the entry file plus every other file of kernels/src as a header."""
        if entry_name not in files:
            raise ValueError(f"the kernel source has no {entry_name} (files: {', '.join(sorted(files)) or 'none'})")
        headers = {n: t for n, t in files.items() if n != entry_name}
        return cls(entry_text=files[entry_name], headers=headers, entry_name=entry_name)

    @classmethod
    def from_dir(cls, src_dir: Path, entry_name: str, header_names: Iterable[str]) -> "KernelSource":
        headers = {name: (src_dir / name).read_text() for name in header_names}
        return cls(entry_text=(src_dir / entry_name).read_text(), headers=headers, entry_name=entry_name)

    def defect_switches(self) -> frozenset[str]:
        """Defect names (lower case) left defined by `#define ATTN_DEFECT_X` / `#undef` lines.

        Mirrors the kernels' `#ifdef ATTN_DEFECT_X`: defined with any value (0 included) is on.
        Read once per source: a device backend asks for every config it launches.
        """
        return self._defect_switches

    @cached_property
    def _defect_switches(self) -> frozenset[str]:
        on: set[str] = set()
        for text in (self.entry_text, *(self.headers[n] for n in sorted(self.headers))):
            for directive, name in _DIRECTIVE.findall(_strip_comments(text)):
                (on.add if directive == "define" else on.discard)(name.lower())
        return frozenset(on)


def _strip_comments(text: str) -> str:
    """Block comments and // comments removed, so a commented-out #define does not count."""
    text = _BLOCK_COMMENT.sub(" ", text)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


@lru_cache(maxsize=1)
def local_source() -> KernelSource:
    """The workers' own kernels/src: what a sweep without a source bundle compiles."""
    return KernelSource.from_dir(SRC_DIR, ENTRY_FILE, HEADER_FILES)


def load_sources() -> tuple[str, dict[str, str], str]:
    """(attention.hip text, {header name: text}, sha256 of all of them) of the local source."""
    src = local_source()
    return src.entry_text, dict(src.headers), src.hash


def source_hash() -> str:
    return local_source().hash
