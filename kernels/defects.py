"""The defect switches: known bugs compiled into the kernels (and honoured by the cpu emulation)
so that a sweep can be shown to catch them. Below the backends, since variant selection and
launch plans read them too."""
from __future__ import annotations


# Defects that can be compiled into the kernels (and honoured by the cpu emulation) to prove
# that a sweep catches the bug classes of rocMLIR's split-KV history: wrong numbers
# (NUMERIC_DEFECTS), and faults a sweep must survive and attribute to their configs.
DEFECTS = {
    "no_neginf_guard": "online softmax computes exp(m_old - m_new) without the -inf - (-inf) guard",
    "floor_blocks_per_split": "blocks per split by floor division (0 iterations when n_blocks < split_kv)",
    "no_zero_sum_guard": "final scaling divides acc by l without the l == 0 guard",
    "causal_off_by_one": "causal mask hides key j == q + prefix (an off-by-one in the causal bound)",
    "oob_store": "the combine stores the last row's output 1 TiB past O (a device fault on a GPU; split_kv > 1)",
    "oob_store_small": "the combine stores the last row's last value 2 elements past the end of O (no fault; split_kv > 1)",
    "missing_barrier": "the combine reads its thread groups' sums without the barrier that orders them (a race; split_kv > 1)",
    "hang": "the combine spins forever on the last row (split_kv > 1)",
    "combine_no_max_shift": "the combine weights each split by exp(LSE_s), not exp(LSE_s - max LSE): float32's exp "
                            "overflows once an LSE passes 88 (split_kv > 1 with large logits)",
}

NUMERIC_DEFECTS = ("no_neginf_guard", "floor_blocks_per_split", "no_zero_sum_guard", "causal_off_by_one",
                   "combine_no_max_shift")
FAULT_DEFECTS = ("oob_store", "oob_store_small", "missing_barrier", "hang")

# Defect switches compiled into the combine kernel (attn_splitkv_combine) alone.
COMBINE_DEFECTS = frozenset({"oob_store", "oob_store_small", "missing_barrier", "hang", "combine_no_max_shift"})

# Defects the cpu emulation has no model of: a race needs threads that share memory.
GPU_ONLY_DEFECTS = frozenset({"missing_barrier"})

# Defects whose trigger lies in the data rather than the shape: logits large enough that an
# unshifted exp leaves float32's range, which standard normal inputs reach only with no softmax
# scale and wide heads. The data regimes with large logits reach them (reference/regimes.py).
DATA_DEFECTS = frozenset({"combine_no_max_shift"})
