"""Draw bench/kernels.py's kernels.json: effective bandwidth per shape, ours beside cuDNN and
flash, with the copy and read-only stream ceilings measured in the same run and, per shape, the
read-only stream's bandwidth over that shape's bytes alone (launch and ramp included).

    python bench/plot_kernels.py RUN_DIR/kernels.json RUN_DIR/kernels.png
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    import matplotlib
except ModuleNotFoundError:  # an optional extra: the service and the CLI never draw
    sys.exit("bench/plot_kernels.py needs matplotlib: pip install 'attnsweep[plot]'")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(src: str, dest: str) -> None:
    run = json.loads(Path(src).read_text())
    cases = [c for c in run["cases"] if c["kind"] != "prefill" and c.get("ours")]
    dtypes = sorted({c["dtype"] for c in cases})
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(12, 4.2 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        cs = [c for c in cases if c["dtype"] == dtype]
        x = np.arange(len(cs))
        for i, (key, label) in enumerate((("ours", "ours"), ("cudnn", "cuDNN"), ("flash", "flash"))):
            tb = [c["bytes"] / c[key] / 1e12 if c.get(key) else 0 for c in cs]
            ax.bar(x + (i - 1) * 0.27, tb, 0.27, label=label)
        floor = [c["bytes"] / c["read_floor"] / 1e12 if c.get("read_floor") else np.nan for c in cs]
        if not np.all(np.isnan(floor)):   # runs before the floor was measured have none
            ax.scatter(x, floor, marker="_", s=600, color="r", zorder=3,
                       label="read-only stream of the shape's bytes alone")
        ax.axhline(run["bandwidth"]["copy_TBps"], color="k", ls="--", lw=1, label="copy")
        ax.axhline(run["bandwidth"]["read_TBps"], color="gray", ls=":", lw=1, label="read-only stream")
        ax.set_xticks(x, [c["name"] for c in cs], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("effective TB/s")
        ax.set_title(f"{dtype} decode, {run['device']}, {run['date']} (Q, K, V read + O written)")
        ax.set_ylim(0, run["bandwidth"]["read_TBps"] * 1.3)
        ax.legend(fontsize=8, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.savefig(dest, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
