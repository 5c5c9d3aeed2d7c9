"""Every file a comment, docstring, help text or document names is a file of the repository.

A path is recognised where it starts with a top-level folder of the repository (`kernels/...`,
`docs/...`), in every tracked text file; a Markdown link is resolved from its document's folder.
Braces (`run{1,2}.txt`) expand and a glob (`run4-*`) must match a tracked file. A path git
ignores names an output (screenshots, built wheels), not a file to find. A run's evidence is an
archive, `RUN.tar.xz` in docs/evidence/ (a bare name is looked for there); `RUN.tar.xz:FILE`
names the file RUN/FILE inside it, which must be there. Files the evidence's
commands ran that are gone are listed, with a commit that holds each, in docs/evidence/README.md
("Files since removed"), and that index is the only file that may name them.
"""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import tarfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE_INDEX = "docs/evidence/README.md"
EVIDENCE = "docs/evidence"
ARCHIVE = re.compile(r"(?<![\w.-])((?:[\w.-]+/)*[\w.-]+\.tar\.xz)(?::((?:[\w./*-]|\{[\w./*,-]*\})+))?")
REMOVED_HEADING = "## Files since removed"
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
BRACES = re.compile(r"\{([^{}]*)\}")


def _git(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, check=True).stdout


@lru_cache(maxsize=1)
def tracked() -> frozenset[str]:
    # Tracked and present: a file deleted in the working tree but not yet from the index is gone.
    return frozenset(p for p in _git("ls-files", "-z").split("\0") if p and (ROOT / p).exists())


@lru_cache(maxsize=1)
def folders() -> frozenset[str]:
    return frozenset(str(parent) for p in tracked() for parent in Path(p).parents if str(parent) != ".")


@lru_cache(maxsize=1)
def path_pattern() -> re.Pattern[str]:
    tops = sorted({p.split("/", 1)[0] for p in tracked() if "/" in p}, key=len, reverse=True)
    # Commas only inside braces: `source=docker/wheelhouse,target=...` names docker/wheelhouse.
    return re.compile(r"(?<![\w./-])((?:%s)/(?:[\w./*-]|\{[\w./*,-]*\})*)"
                      % "|".join(map(re.escape, tops)))


def expand(path: str) -> list[str]:
    """`a{1,2}b` -> [`a1b`, `a2b`], recursively."""
    m = BRACES.search(path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in expand(path[:m.start()] + alt + path[m.end():])]


def exists(path: str) -> bool:
    path = path.rstrip("/") if path != "/" else path
    if any(ch in path for ch in "*?["):
        return any(fnmatch.fnmatchcase(p, path) or fnmatch.fnmatchcase(p, path + "/*") for p in tracked())
    return path in tracked() or path in folders()


@lru_cache(maxsize=None)
def archive_members(path: str) -> frozenset[str]:
    """The files and folders inside a tracked archive, each as RUN/..."""
    with tarfile.open(ROOT / path) as tar:
        names = [m.name.rstrip("/") for m in tar.getmembers()]
    return frozenset(names) | frozenset(str(parent) for n in names for parent in Path(n).parents if str(parent) != ".")


def archive_ref_missing(folder: str, archive: str, member: str | None) -> str | None:
    """None when `archive` (a repository path, one relative to `folder`, or a name in
    docs/evidence/) exists and holds `member` (RUN/member, braces and globs allowed); else what
    is missing."""
    paths = [archive, os.path.normpath(os.path.join(folder, archive)), f"{EVIDENCE}/{archive}"]
    path = next((p for p in paths if p in tracked()), None)
    if path is None:
        return archive
    if not member:
        return None
    run = Path(archive).name[: -len(".tar.xz")]
    members = archive_members(path)
    for m in expand(member.rstrip(".-")):
        name = f"{run}/{m.rstrip('/')}"
        if not (any(fnmatch.fnmatchcase(n, name) for n in members) if any(c in name for c in "*?[") else name in members):
            return f"{archive}:{m}"
    return None


def ignored(paths: list[str]) -> set[str]:
    """The paths git ignores (outputs: test artifacts, built wheels)."""
    if not paths:
        return set()
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(paths),
                          capture_output=True, text=True)
    return set(proc.stdout.split("\n")) - {""}


def removed_scripts() -> dict[str, str]:
    """docs/evidence/README.md's list of scripts since removed: path -> the commit that holds it."""
    text = (ROOT / EVIDENCE_INDEX).read_text()
    section = text.split(REMOVED_HEADING, 1)[1].split("\n## ", 1)[0] if REMOVED_HEADING in text else ""
    return dict(re.findall(r"^- `([^`]+)` \(`git show ([0-9a-f]{7,40}):", section, flags=re.M))


def named_paths(name: str, text: str) -> list[tuple[int, str]]:
    """(line, path) for every repository path and Markdown link target named in `text` (a file's)."""
    found = []
    folder = Path(name).parent
    for number, line in enumerate(text.split("\n"), 1):
        for m in path_pattern().finditer(line):
            if re.fullmatch(r"\w+/s", m.group(1)):
                continue   # a rate (`sweeps/s`), not a path
            found += [(number, p) for p in expand(m.group(1).rstrip(".-"))]
        if name.endswith(".md"):
            for m in MD_LINK.finditer(line):
                target = m.group(1).split("#", 1)[0]
                if target and not re.match(r"[a-z]+:", target) and not target.startswith("/"):
                    resolved = (ROOT / folder / target).resolve()
                    if resolved.is_relative_to(ROOT):
                        found.append((number, str(resolved.relative_to(ROOT)) + ("/" if target.endswith("/") else "")))
    return found


def missing(files: dict[str, str]) -> list[str]:
    """`file:line: path` for each named path that is not a file or folder of the repository, and
    each named archive (or file in one) that is not there."""
    removed = removed_scripts()
    candidates = [(name, line, p) for name, text in files.items() for line, p in named_paths(name, text)
                  if not exists(p)]
    outputs = ignored(sorted({p for _, _, p in candidates}))
    found = [(name, line, p) for name, line, p in candidates
             if p not in outputs and not (name == EVIDENCE_INDEX and p in removed)]
    for name, text in files.items():
        for number, line in enumerate(text.split("\n"), 1):
            for m in ARCHIVE.finditer(line):
                gone = archive_ref_missing(str(Path(name).parent), m.group(1), m.group(2))
                if gone and not any(n == name and ln == number and gone == p for n, ln, p in found):
                    found.append((name, number, gone))
    return [f"{name}:{line}: {p}" for name, line, p in found]


def text_files() -> dict[str, str]:
    files = {}
    for name in sorted(tracked()):
        if ROOT / name == Path(__file__).resolve():
            continue   # its examples of stale paths are meant to be missing
        try:
            files[name] = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError):
            continue   # binary: plots, packed evidence
    return files


def test_every_file_named_in_the_repository_exists():
    assert missing(text_files()) == []


def test_a_stale_path_a_broken_link_and_an_empty_glob_are_found():
    files = {
        "kernels/example.py": '"""The defects of kernels/backend.py DEFECTS, and kernels/select.py."""\n',
        "docs/example.md": "See [the spec](spec.md), [a gone page](gone.md) and docs/evidence/none-*.txt.\n",
        "tools/example.py": "# reads kernels/src/{attention.hip,missing.h}\n",
    }
    assert missing(files) == [
        "kernels/example.py:1: kernels/backend.py",
        "docs/example.md:1: docs/evidence/none-*.txt",
        "docs/example.md:1: docs/gone.md",
        "tools/example.py:1: kernels/src/missing.h",
    ]


def test_a_file_named_inside_a_run_archive_must_be_in_it():
    run = sorted(p for p in tracked() if p.startswith(f"{EVIDENCE}/") and p.endswith(".tar.xz"))[0]
    name = Path(run).name
    first = sorted(m for m in archive_members(run) if "/" in m)[0].split("/", 1)[1]
    files = {"docs/example.md": f"See {name}:{first}, {run}, {name}:no-such-file.txt and gone-run.tar.xz.\n"}
    assert missing(files) == [f"docs/example.md:1: {name}:no-such-file.txt", "docs/example.md:1: gone-run.tar.xz"]


def test_an_ignored_output_and_a_rate_are_no_references():
    assert missing({"tests/e2e/example.py": "# screenshots land in tests/e2e/artifacts/NAME.png\n"}) == []
    assert missing({"docs/example.md": "80 sweeps/s, 61.3 configs/s; but sweeps/sx.py is a path\n"}) == [
        "docs/example.md:1: sweeps/sx.py"]


def test_a_removed_script_is_named_only_by_the_evidence_index_and_is_gone():
    removed = removed_scripts()
    assert removed, f"{EVIDENCE_INDEX} lists the scripts since removed under {REMOVED_HEADING!r}"
    for path, commit in removed.items():
        assert not exists(path), f"{path} is listed as removed but is in the repository"
        assert _git("cat-file", "-t", f"{commit}:{path}").strip() == "blob", (path, commit)
        assert missing({"docs/example.md": f"ran `{path}`\n"}) == [f"docs/example.md:1: {path}"]


@pytest.mark.parametrize("text, expected", [
    ("a{1,2}b", ["a1b", "a2b"]),
    ("x/{a,b}/{c,d}.py", ["x/a/c.py", "x/a/d.py", "x/b/c.py", "x/b/d.py"]),
    ("plain.py", ["plain.py"]),
])
def test_braces_expand(text, expected):
    assert expand(text) == expected
