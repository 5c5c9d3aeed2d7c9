"""bench/plot_kernels.py draws a kernels.json with and without the per-shape read floor. The
script runs as a command on a small kernels.json, as after a benchmark run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np

ROOT = Path(__file__).parents[3]


def _run(floor: bool) -> dict:
    cases = []
    for name, nbytes, ours in (("(8,32,8,4096,128)", 134_250_496, 42.8e-6), ("(1,8,1,65536,128)", 33_558_528, 20.6e-6)):
        c = {"dtype": "f16", "name": name, "kind": "decode", "bytes": nbytes, "ours": ours,
             "cudnn": ours * 0.95, "flash": ours * 1.5}
        if floor:
            c["read_floor"] = ours * 0.6
        cases.append(c)
    cases.append({"dtype": "f16", "name": "prefill", "kind": "prefill", "bytes": 1, "ours": 1e-3})
    return {"device": "test", "date": "2026-12-04", "bandwidth": {"copy_TBps": 4.29, "read_TBps": 4.47},
            "cases": cases}


def _red_pixels(png: Path) -> int:
    img = mpimg.imread(png)[..., :3]
    return int(np.sum((img[..., 0] > 0.9) & (img[..., 1] < 0.2) & (img[..., 2] < 0.2)))


def test_the_floor_is_drawn_where_measured(tmp_path: Path):
    pngs = {}
    for floor in (True, False):
        src = tmp_path / f"kernels-{floor}.json"
        src.write_text(json.dumps(_run(floor)))
        pngs[floor] = tmp_path / f"kernels-{floor}.png"
        subprocess.run([sys.executable, str(ROOT / "bench/plot_kernels.py"), str(src), str(pngs[floor])],
                       check=True, capture_output=True, timeout=120)
    # the floor marks (and their legend entry) are the plot's only pure red
    assert _red_pixels(pngs[True]) > 50
    assert _red_pixels(pngs[False]) == 0


def test_matplotlib_is_an_optional_extra_used_only_by_bench():
    import re
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert not [d for d in project["dependencies"] if d.startswith("matplotlib")]
    assert [d for d in project["optional-dependencies"]["plot"] if d.startswith("matplotlib")]
    # the packages the project installs (pyproject's include list: "api*" -> api)
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    users = [str(p.relative_to(ROOT)) for pkg in packages for p in (ROOT / pkg).rglob("*.py")
             if re.search(r"^\s*(import|from) matplotlib", p.read_text(), re.M)]
    assert users == []
