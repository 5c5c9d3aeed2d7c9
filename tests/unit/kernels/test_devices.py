"""--gpus lists and pinning a process to one GPU."""
import os

import pytest

from kernels.devices import pin_gpu, resolve_gpus, visible_id


def test_all_means_every_visible_gpu_and_lists_may_repeat():
    assert resolve_gpus("all", 4) == [0, 1, 2, 3]
    assert resolve_gpus(" ALL ", 1) == [0]
    assert resolve_gpus("2,0", 4) == [2, 0]
    assert resolve_gpus("0,0", 1) == [0, 0]  # two workers sharing the one GPU


@pytest.mark.parametrize("spec, count, rule", [
    ("all", 0, "no GPU is visible"),
    ("0", 0, "no GPU is visible"),
    ("2", 2, "GPU 2 does not exist; 2 visible (0..1)"),
    ("0,x", 2, "must be 'all' or GPU indices"),
    ("-1", 2, "must be 'all' or GPU indices"),
    ("", 2, "must be 'all' or GPU indices"),
])
def test_bad_lists_name_the_option_and_the_rule(spec, count, rule):
    with pytest.raises(ValueError, match="--gpus") as err:
        resolve_gpus(spec, count)
    assert rule in str(err.value)


def test_a_child_is_pinned_through_the_parents_own_mask():
    assert visible_id(1, {}) == "1"
    assert visible_id(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "3"
    assert visible_id(0, {"HIP_VISIBLE_DEVICES": "5"}) == "5"
    with pytest.raises(ValueError, match="only 1 visible"):
        visible_id(1, {"CUDA_VISIBLE_DEVICES": "5"})


def test_pinning_sets_both_runtimes_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    assert pin_gpu(None) is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert pin_gpu(3) == "3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3" and os.environ["HIP_VISIBLE_DEVICES"] == "3"
    assert pin_gpu(0) == "3"  # index 0 of what this process now sees
