// The arithmetic both builds share (host C++ and CUDA): storage types, layouts, masks, the split
// boundaries of docs/spec.md §3, one split's partial and the combine. Plain C++ with HD marking
// what CUDA also compiles for the device.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attnsweep_kernel.h"

#ifdef __CUDACC__
#define HD __host__ __device__
#else
#define HD
#endif

namespace splitkv {

constexpr int BLOCK_N = 32;       // the key tile the splits are cut in (docs/spec.md §3)
constexpr int MAX_HEAD_DIM = 1024;

HD inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
HD inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

HD inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);   // subnormal: mant * 2^-24
        return sign ? -v : v;
    }
    if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
    return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

HD inline uint16_t float_to_half(float f) {   // round to nearest, ties to even
    uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
    int32_t exp = (int32_t)((x >> 23) & 0xff);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), value = mant >> shift, rest = mant & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (value & 1))) value++;
        return (uint16_t)(sign | value);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13), rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;   // a carry into the exponent is right too
    return (uint16_t)h;
}

HD inline float bf16_to_float(uint16_t b) { return float_of((uint32_t)b << 16); }

HD inline uint16_t float_to_bf16(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);   // NaN stays NaN
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

HD inline float load(const void *p, int64_t i, int dtype) {
    if (dtype == ATTNSWEEP_F32) return ((const float *)p)[i];
    uint16_t bits = ((const uint16_t *)p)[i];
    return dtype == ATTNSWEEP_BF16 ? bf16_to_float(bits) : half_to_float(bits);
}

HD inline void store(void *p, int64_t i, int dtype, float value) {
    if (dtype == ATTNSWEEP_F32) ((float *)p)[i] = value;
    else ((uint16_t *)p)[i] = dtype == ATTNSWEEP_BF16 ? float_to_bf16(value) : float_to_half(value);
}

// Element offsets of the physical layouts (trans_*: [..., dim, seq]).
struct Layout {
    const attnsweep_config *c;
    HD int64_t q(int b, int h, int s, int d) const {
        int64_t base = (int64_t)b * c->num_heads_q + h;
        return c->trans_q ? (base * c->head_dim_qk + d) * c->seq_len_q + s : (base * c->seq_len_q + s) * c->head_dim_qk + d;
    }
    HD int64_t k(int b, int hk, int j, int d) const {
        int64_t base = (int64_t)b * c->num_heads_kv + hk;
        return c->trans_k ? (base * c->head_dim_qk + d) * c->seq_len_k + j : (base * c->seq_len_k + j) * c->head_dim_qk + d;
    }
    HD int64_t v(int b, int hk, int j, int d) const {
        int64_t base = (int64_t)b * c->num_heads_kv + hk;
        return c->trans_v ? (base * c->head_dim_v + d) * c->seq_len_k + j : (base * c->seq_len_k + j) * c->head_dim_v + d;
    }
    HD int64_t o(int b, int h, int s, int d) const {
        int64_t base = (int64_t)b * c->num_heads_q + h;
        return c->trans_o ? (base * c->head_dim_v + d) * c->seq_len_q + s : (base * c->seq_len_q + s) * c->head_dim_v + d;
    }
    HD int64_t bias(int b, int h, int s, int j) const {
        return (((int64_t)b * c->num_heads_q + h) * c->seq_len_q + s) * c->seq_len_k + j;
    }
};

// The last key a row may see (docs/spec.md §2), and the keys [begin, end) of split s (§3).
HD inline int last_key(const attnsweep_config *c, int b) {
    return c->current_seq_len ? c->current_seq_len[b] : c->seq_len_k - 1;
}

HD inline int row_limit(const attnsweep_config *c, int b, int s) {
    int limit = last_key(c, b);
    if (c->causal) {
        int bound = s + (c->prefix_offset ? c->prefix_offset[b] : 0);
        limit = bound < limit ? bound : limit;
    }
    return limit;
}

HD inline void split_keys(const attnsweep_config *c, int b, int split, int *begin, int *end) {
    int last = last_key(c, b);
    int n_blocks = (last + BLOCK_N) / BLOCK_N;
    int per_split = (n_blocks + c->split_kv - 1) / c->split_kv;
    int first_block = split * per_split, stop_block = first_block + per_split;
    if (stop_block > n_blocks) stop_block = n_blocks;
    *begin = first_block * BLOCK_N;
    *end = first_block >= n_blocks ? *begin : (stop_block * BLOCK_N < last + 1 ? stop_block * BLOCK_N : last + 1);
}

// The combine of docs/spec.md §3 as kernels do it: every split weighted by exp(LSE_s - M),
// empty and invalid splits holding O_s = 0, LSE_s = -inf.
HD inline float combine_max(const float *lse, int splits, int64_t stride) {
    float m = -3.402823466e38f;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, lse[s * stride]);
    return m;
}

// What both builds answer for attnsweep_kernel_supports, and the checks that open every run.
inline int supports(const attnsweep_config *c, char *message, size_t message_len) {
    if (c->dtype == ATTNSWEEP_I8) {
        snprintf(message, message_len, "dtype_i8: this example has no int8 path");
        return ATTNSWEEP_NOT_APPLICABLE;
    }
    return ATTNSWEEP_OK;
}

inline int check_call(const attnsweep_config *c, char *message, size_t message_len) {
    if (c->abi_version != ATTNSWEEP_ABI_VERSION) {
        snprintf(message, message_len, "ABI version %d; this library speaks %d", c->abi_version, ATTNSWEEP_ABI_VERSION);
        return ATTNSWEEP_ERROR;
    }
    return supports(c, message, message_len);
}

}  // namespace splitkv
