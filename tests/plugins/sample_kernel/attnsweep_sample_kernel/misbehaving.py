"""A plug-in that breaks its contract in every way a sweep must survive, chosen by the config's
data_seed: it raises, returns the wrong shape, returns NaN, never returns, or answers right."""
from __future__ import annotations

import time

import numpy as np

from attnsweep_sample_kernel import NumpyAttention

BEHAVIOURS = ("correct", "raises", "wrong_shape", "nan", "never_returns")


def behaviour(config) -> str:
    return BEHAVIOURS[config.data_seed % len(BEHAVIOURS)]


class Misbehaving(NumpyAttention):
    name = "misbehaving"

    def run(self, config, inputs):
        how = behaviour(config)
        if how == "raises":
            raise ValueError("the kernel gave up on this config")
        if how == "wrong_shape":
            out, lse = super().run(config, inputs)
            return out.reshape(-1), lse
        if how == "nan":
            out, lse = super().run(config, inputs)
            return np.full_like(out, np.nan), lse
        if how == "never_returns":
            while True:
                time.sleep(1)
        return super().run(config, inputs)
