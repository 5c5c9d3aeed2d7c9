"""Which GPU a process uses: `--gpus` lists, and pinning a process to one GPU.

A process is pinned by CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES, set before anything loads
a GPU runtime, so its backend's device 0 is the GPU it was given. Indices are those the parent
sees: where the parent itself runs under CUDA_VISIBLE_DEVICES=2,3, index 1 is physical GPU 3.
"""
from __future__ import annotations

import os
from typing import Mapping

VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def resolve_gpus(spec: str, count: int) -> list[int]:
    """`all` or a comma-separated list of GPU indices (repeats allowed: several workers on one
    GPU) against the `count` GPUs visible. Raises ValueError naming --gpus and the rule."""
    text = spec.strip().lower()
    if count <= 0:
        raise ValueError(f"--gpus {spec!r}: no GPU is visible to this backend")
    if text == "all":
        return list(range(count))
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--gpus {spec!r}: must be 'all' or GPU indices separated by commas, e.g. 0,1")
        index = int(part)
        if index >= count:
            raise ValueError(f"--gpus {spec!r}: GPU {index} does not exist; {count} visible (0..{count - 1})")
        out.append(index)
    return out


def visible_id(index: int, environ: Mapping[str, str] = os.environ) -> str:
    """The value that pins a child to the parent's GPU `index` (the parent's mask applied)."""
    for var in VISIBILITY_VARS:
        mask = environ.get(var, "").strip()
        if mask:
            ids = [x.strip() for x in mask.split(",") if x.strip()]
            if index >= len(ids):
                raise ValueError(f"GPU {index}: {var}={mask} makes only {len(ids)} visible")
            return ids[index]
    return str(index)


def pin_gpu(index: int | None) -> str | None:
    """Pin this process to GPU `index` (as its parent saw it); returns the id set, None when unpinned."""
    if index is None:
        return None
    gpu = visible_id(index)
    for var in VISIBILITY_VARS:
        os.environ[var] = gpu
    return gpu
