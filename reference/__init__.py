"""The host reference: inputs, exact and split-KV attention, and the verifier metrics.

Knows nothing of GPUs or the database; kernels/ and sweeps/ build on it.
"""
from reference.exact import attention_exact
from reference.inputs import make_inputs, output_dtypes, qk_dtype, value_dtype
from reference.layout import logical_view, to_logical, to_physical
from reference.lowprec import attention_lowprec
from reference.metrics import err_ratio, lse_metrics, partial_metrics, tensor_metrics, verify_outputs
from reference.splitkv import RowScales, SplitKVResult, attention_splitkv, magnitude_reference
from reference.splits import (
    blocks_per_split,
    combine_masked,
    combine_unmasked,
    n_blocks,
    split_block_ranges,
    split_partials,
    valid_splits,
)

__all__ = [
    "magnitude_reference", "RowScales",
    "make_inputs", "output_dtypes", "qk_dtype", "value_dtype",
    "attention_exact", "attention_splitkv", "SplitKVResult", "attention_lowprec",
    "to_physical", "to_logical", "logical_view",
    "tensor_metrics", "lse_metrics", "partial_metrics", "err_ratio", "verify_outputs",
    "n_blocks", "blocks_per_split", "split_block_ranges", "valid_splits", "split_partials",
    "combine_masked", "combine_unmasked",
]
