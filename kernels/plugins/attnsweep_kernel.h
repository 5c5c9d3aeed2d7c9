/* The C ABI of an attnsweep kernel plug-in (docs/plugins.md): a shared library that exports
 * attnsweep_kernel_run, loaded with `attnsweep run --kernel so:PATH`.
 *
 * attnsweep draws the inputs, lays them out as the config says (trans_*), copies them to the
 * device the library names (attnsweep_kernel_device: "cpu" or "cuda"), calls
 * attnsweep_kernel_run once per config, and checks what the kernel wrote against a float64
 * reference (docs/spec.md). Semantics of every field: docs/spec.md §1-§3.
 */
#ifndef ATTNSWEEP_KERNEL_H
#define ATTNSWEEP_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNSWEEP_ABI_VERSION 1

/* Status codes of attnsweep_kernel_run. */
#define ATTNSWEEP_OK 0
#define ATTNSWEEP_NOT_APPLICABLE 1 /* the kernel does not run this config; message: "reason: detail" */
#define ATTNSWEEP_ERROR 2          /* anything else failed; message says what */

/* dtype: storage type of Q, K and V. I8: Q and K int8, V, bias and O f16, LSE f16. */
enum attnsweep_dtype { ATTNSWEEP_F16 = 0, ATTNSWEEP_BF16 = 1, ATTNSWEEP_F32 = 2, ATTNSWEEP_I8 = 3 };

typedef struct attnsweep_config {
    int32_t abi_version;           /* ATTNSWEEP_ABI_VERSION */
    int32_t dtype;                 /* enum attnsweep_dtype */
    int32_t g, seq_len_q, seq_len_k, num_heads_q, num_heads_kv, head_dim_qk, head_dim_v;
    int32_t with_attn_scale, with_attn_bias, causal, return_lse, split_kv;
    int32_t trans_q, trans_k, trans_v, trans_o;
    float softmax_scale;           /* 1/sqrt(head_dim_qk) when with_attn_scale, else 1 */
    float quant_scale;             /* I8 only */
    int32_t quant_zero_point;      /* I8 only */
    const int32_t *prefix_offset;  /* g entries (host memory), or NULL */
    const int32_t *current_seq_len;/* g entries (host memory), or NULL: the last valid key, inclusive */
} attnsweep_config;

/* Pointers on the library's device (host memory for "cpu"), each buffer dense in its layout:
 * q [g, Hq, Sq, Dqk] ([g, Hq, Dqk, Sq] when trans_q), k [g, Hkv, Sk, Dqk] (trans_k: [.., Dqk, Sk]),
 * v [g, Hkv, Sk, Dv] (trans_v: [.., Dv, Sk]), bias [g, Hq, Sq, Sk] or NULL;
 * out [g, Hq, Sq, Dv] (trans_o: [.., Dv, Sq]) in the output type; lse [g, Hq, Sq] (f32; f16 for I8)
 * or NULL when !return_lse. 16-bit floats are IEEE binary16 or bfloat16 bit patterns. */
typedef struct attnsweep_tensors {
    const void *q, *k, *v, *bias;
    void *out, *lse;
    void *stream;                  /* the CUDA stream to launch on (NULL: the default stream) */
} attnsweep_tensors;

/* Required. Runs one config; returns an ATTNSWEEP_* status and, for any status but OK, writes
 * a NUL-terminated one-line message of at most message_len bytes. The call returns when the
 * outputs are written (a device kernel synchronizes its stream). */
int attnsweep_kernel_run(const attnsweep_config *config, const attnsweep_tensors *tensors,
                         char *message, size_t message_len);

/* Optional: the kernel's name and version (default: the library's file name and its sha256),
 * and its device, "cpu" (the default) or "cuda". */
const char *attnsweep_kernel_name(void);
const char *attnsweep_kernel_version(void);
const char *attnsweep_kernel_device(void);

/* Optional: whether the kernel runs a config without running it (ATTNSWEEP_OK or
 * ATTNSWEEP_NOT_APPLICABLE with "reason: detail" in message). Without it, a run that answers
 * ATTNSWEEP_NOT_APPLICABLE counts the same. */
int attnsweep_kernel_supports(const attnsweep_config *config, char *message, size_t message_len);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSWEEP_KERNEL_H */
