"""A kernel repository of another project in a temporary folder: examples/c_abi with the C-ABI
header at the paths its Makefile names, and an attnsweep.toml that builds it on the host."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[3]
C_ABI = ('[kernel]\nbuild = ["make", "-C", "examples/c_abi", "host", "OUT=."]\n'
         'plugin = "so:examples/c_abi/libsplitkv_host.so"\n')
CORE = "examples/c_abi/splitkv_core.h"
# The causal bound one key too far: every causal config whose rows end before the last key fails.
CAUSAL_OFF_BY_ONE = ("int bound = s + (c->prefix_offset", "int bound = s + 1 + (c->prefix_offset")
# A causal config the defect breaks and the example passes, small enough to run in milliseconds.
CAUSAL = dict(dtype="f32", g=1, seq_len_q=4, seq_len_k=40, num_heads_q=1, num_heads_kv=1, head_dim_qk=8,
              head_dim_v=8, causal=True)


def causal_off_by_one(text: str) -> str:
    assert CAUSAL_OFF_BY_ONE[0] in text
    return text.replace(*CAUSAL_OFF_BY_ONE)


class PluginRepo:
    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main")
        shutil.copytree(ROOT / "examples" / "c_abi", path / "examples" / "c_abi")
        (path / "kernels" / "plugins").mkdir(parents=True)
        shutil.copy(ROOT / "kernels" / "plugins" / "attnsweep_kernel.h", path / "kernels" / "plugins")
        self.originals = {str(f.relative_to(path)): f.read_text() for f in (path / "examples").rglob("*") if f.is_file()}
        self.pristine = self.originals[CORE]

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=self.path,
                              check=True, capture_output=True, text=True).stdout.strip()

    def commit(self, message: str, manifest: str | None = C_ABI, files: dict[str, str] | None = None,
               core: Callable[[str], str] | None = None) -> str:
        """Commit the example as copied, with `manifest` as attnsweep.toml (None: no file), `files`
        written over it and the core header edited by `core`; its id."""
        for name, text in self.originals.items():
            (self.path / name).write_text(text)
        (self.path / CORE).write_text(core(self.pristine) if core else self.pristine)
        target = self.path / "attnsweep.toml"
        if manifest is None:
            target.unlink(missing_ok=True)
        else:
            target.write_text(manifest)
        for name, text in (files or {}).items():
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_text(text)
        self.git("add", "-A")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")
