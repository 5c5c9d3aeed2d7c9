// attention.hip — split-KV (flash-decoding) attention forward and its combine (SPEC §1–§3).
//
// One source for ROCm (hiprtc) and NVIDIA (NVRTC) through hip_compat.h. Correctness first: a
// plain scalar kernel with f32 (int32 for i8) accumulation; performance is a later issue.
//
// attn_splitkv_fwd<T, DQK_B, DV_B, BLOCK_N, NT>
//   grid  = (g*Hq*Sq, S): blockIdx.x is the query row r = (b*Hq + h)*Sq + q, blockIdx.y the split s
//   block = NT threads.
//   Each block walks the KV blocks of split s (of BLOCK_N keys each) with an online softmax and
//   writes, when write_partials != 0, the f32 partials
//       o_part  [S, g, Hq, Sq, Dv]  (O_s normalised by its own row sum)
//       lse_part[S, g, Hq, Sq]
//   and otherwise (split_kv == 1) the final O (storage dtype; f16 for i8) and LSE directly.
//   DQK_B / DV_B are the head-dim buckets: compile-time loop bounds with masking against the
//   runtime dqk / dv (bucket 0 = the general path: runtime bounds, any size up to 1024).
//
// attn_splitkv_combine<OT, LT, NT>
//   grid = (g*Hq*Sq), block = NT. Weights EVERY split by exp(LSE_s - M), no validity mask
//   (M = -FLT_MAX when all LSE_s are -inf; a zero denominator stores O = 0, LSE = -inf).
//
// Split boundaries (SPEC §3) depend on the batch entry only: L_b = current_seq_len[b] or Sk-1,
// n_blocks = (L_b + BLOCK_N) / BLOCK_N, blocks_per_split = ceil(n_blocks / S), split s covers
// blocks [s*bps, min((s+1)*bps, n_blocks)). An empty split or a split with no visible key for a
// row writes O_s = 0, LSE_s = -inf.
//
// Defect switches (each re-introduces one bug of rocMLIR's split-KV history, see backend.DEFECTS):
//   ATTN_DEFECT_NO_NEGINF_GUARD        exp(m_old - m_new) and exp(s - m_new) with m_new = -inf
//   ATTN_DEFECT_FLOOR_BLOCKS_PER_SPLIT blocks_per_split = n_blocks / S (floor)
//   ATTN_DEFECT_NO_ZERO_SUM_GUARD      O_s = acc / l without the l == 0 guard
//   ATTN_DEFECT_CAUSAL_OFF_BY_ONE      causal mask hides key j == q + prefix
#include "hip_compat.h"

#ifndef ATTN_MAX_HEAD_DIM
#define ATTN_MAX_HEAD_DIM 1024
#endif

// ---- number types --------------------------------------------------------------------------
// AttnTypes<T>: acc_t accumulates Q.K (int32 for i8), out_t is the type of V, bias and O
// (f16 for i8), lse_t the type of the final LSE (f32; f16 for i8).
template <typename T> struct AttnTypes;
template <> struct AttnTypes<__half> {
    typedef float acc_t; typedef __half out_t; typedef float lse_t;
    static constexpr bool quantized = false;
};
template <> struct AttnTypes<__hip_bfloat16> {
    typedef float acc_t; typedef __hip_bfloat16 out_t; typedef float lse_t;
    static constexpr bool quantized = false;
};
template <> struct AttnTypes<float> {
    typedef float acc_t; typedef float out_t; typedef float lse_t;
    static constexpr bool quantized = false;
};
template <> struct AttnTypes<signed char> {
    typedef int acc_t; typedef __half out_t; typedef __half lse_t;
    static constexpr bool quantized = true;
};

__device__ __forceinline__ float attn_to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float attn_to_float(__hip_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float attn_to_float(float x) { return x; }

__device__ __forceinline__ float attn_to_acc(__half x, float) { return __half2float(x); }
__device__ __forceinline__ float attn_to_acc(__hip_bfloat16 x, float) { return __bfloat162float(x); }
__device__ __forceinline__ float attn_to_acc(float x, float) { return x; }
__device__ __forceinline__ int attn_to_acc(signed char x, int) { return (int)x; }

template <typename T> __device__ __forceinline__ T attn_from_float(float x);
template <> __device__ __forceinline__ __half attn_from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __hip_bfloat16 attn_from_float<__hip_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ float attn_from_float<float>(float x) { return x; }

// ---- the split kernel ----------------------------------------------------------------------
template <typename T, int DQK_B, int DV_B, int BLOCK_N, int NT>
__global__ void __launch_bounds__(NT) attn_splitkv_fwd(
    const T* __restrict__ q, const T* __restrict__ k,
    const typename AttnTypes<T>::out_t* __restrict__ v,
    const typename AttnTypes<T>::out_t* __restrict__ bias,     // [g, Hq, Sq, Sk] or null
    typename AttnTypes<T>::out_t* __restrict__ o,              // final O (split_kv == 1)
    typename AttnTypes<T>::lse_t* __restrict__ lse,            // final LSE [g, Hq, Sq] or null
    float* __restrict__ o_part, float* __restrict__ lse_part,  // partials (split_kv > 1)
    const int* __restrict__ prefix_offset,                     // [g] or null
    const int* __restrict__ current_seq_len,                   // [g] or null
    int g, int hq, int hkv, int sq, int sk, int dqk, int dv,
    long long q_sb, long long q_sh, long long q_ss, long long q_sd,
    long long k_sb, long long k_sh, long long k_ss, long long k_sd,
    long long v_sb, long long v_sh, long long v_ss, long long v_sd,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd,
    int num_splits, int write_partials, int causal, float qk_scale,
    float quant_scale, int quant_zero_point)
{
    typedef typename AttnTypes<T>::acc_t acc_t;
    typedef typename AttnTypes<T>::out_t out_t;
    typedef typename AttnTypes<T>::lse_t lse_t;
    constexpr int KSPLIT = NT / BLOCK_N;                 // threads sharing one key's dot product
    constexpr int DQK_CAP = DQK_B > 0 ? DQK_B : ATTN_MAX_HEAD_DIM;
    constexpr int DV_CAP = DV_B > 0 ? DV_B : ATTN_MAX_HEAD_DIM;
    constexpr int ACC_N = (DV_CAP + NT - 1) / NT;        // output dims owned by one thread
    static_assert(NT % BLOCK_N == 0, "NT must be a multiple of BLOCK_N");
    static_assert(DQK_B % KSPLIT == 0, "DQK_B must be a multiple of NT / BLOCK_N");

    __shared__ acc_t q_s[DQK_CAP];
    __shared__ acc_t part_s[KSPLIT][BLOCK_N];
    __shared__ float s_s[BLOCK_N];    // logits of the current KV block
    __shared__ float p_s[BLOCK_N];    // probabilities used in P.V (f16-rounded for i8)
    __shared__ float pl_s[BLOCK_N];   // probabilities summed into l

    const int tid = (int)threadIdx.x;
    const long long row = (long long)blockIdx.x;     // (b*hq + h)*sq + qi
    const int split = (int)blockIdx.y;
    const int qi = (int)(row % sq);
    const long long bh = row / sq;
    const int h = (int)(bh % hq);
    const int b = (int)(bh / hq);
    const int kvh = h / (hq / hkv);
    const long long rows = (long long)g * hq * sq;

    // Split boundaries: batch entry only (never the query row or tile).
    const int last_key = current_seq_len ? current_seq_len[b] : sk - 1;
    const int n_blocks = (last_key + BLOCK_N) / BLOCK_N;
#ifdef ATTN_DEFECT_FLOOR_BLOCKS_PER_SPLIT
    const int blocks_per_split = n_blocks / num_splits;
#else
    const int blocks_per_split = (n_blocks + num_splits - 1) / num_splits;
#endif
    const int blk_begin = split * blocks_per_split;
    const int blk_end = min(blk_begin + blocks_per_split, n_blocks);

    // Causal bound of this row: key j is visible iff j <= causal_last.
    long long causal_last = (long long)last_key;
    if (causal) {
        const long long prefix = prefix_offset ? (long long)prefix_offset[b] : 0;
#ifdef ATTN_DEFECT_CAUSAL_OFF_BY_ONE
        causal_last = (long long)qi + prefix - 1;
#else
        causal_last = (long long)qi + prefix;
#endif
    }

    const T* qp = q + (long long)b * q_sb + (long long)h * q_sh + (long long)qi * q_ss;
    const T* kp = k + (long long)b * k_sb + (long long)kvh * k_sh;
    const out_t* vp = v + (long long)b * v_sb + (long long)kvh * v_sh;
    const out_t* bp = bias ? bias + row * (long long)sk : (const out_t*)0;

    for (int d = tid; d < dqk; d += NT) q_s[d] = attn_to_acc(qp[(long long)d * q_sd], acc_t());
    __syncthreads();

    float m = ATTN_NEG_INF;   // running max (identical in every thread)
    float l = 0.0f;           // running sum (identical in every thread)
    float acc[ACC_N];
#pragma unroll
    for (int a = 0; a < ACC_N; ++a) acc[a] = 0.0f;

    const int jj = tid % BLOCK_N;   // key of this thread in the Q.K phase
    const int sl = tid / BLOCK_N;   // its slice of the head dimension

    for (int blk = blk_begin; blk < blk_end; ++blk) {
        const int j0 = blk * BLOCK_N;
        // 1. partial dot products: KSPLIT threads per key, each over a strided slice of dqk.
        {
            const int j = j0 + jj;
            acc_t dot = acc_t(0);
            if (j <= last_key) {
                const T* kr = kp + (long long)j * k_ss;
                if (DQK_B > 0) {
#pragma unroll
                    for (int i = 0; i < DQK_CAP / KSPLIT; ++i) {
                        const int d = sl + i * KSPLIT;
                        if (d < dqk) dot += q_s[d] * attn_to_acc(kr[(long long)d * k_sd], acc_t());
                    }
                } else {
                    for (int d = sl; d < dqk; d += KSPLIT)
                        dot += q_s[d] * attn_to_acc(kr[(long long)d * k_sd], acc_t());
                }
            }
            part_s[sl][jj] = dot;
        }
        __syncthreads();
        // 2. logits of the block (masked keys are -inf).
        if (tid < BLOCK_N) {
            const int j = j0 + tid;
            float x = ATTN_NEG_INF;
            if (j <= last_key && (long long)j <= causal_last) {
                acc_t tot = acc_t(0);
#pragma unroll
                for (int t = 0; t < KSPLIT; ++t) tot += part_s[t][tid];
                if (AttnTypes<T>::quantized) {
                    x = (float)((int)tot - quant_zero_point) * quant_scale;
                } else {
                    x = (float)tot;
                }
                x *= qk_scale;
                if (bp) x += attn_to_float(bp[j]);
            }
            s_s[tid] = x;
        }
        __syncthreads();
        // 3. online softmax update.
        float m_blk = ATTN_NEG_INF;
#pragma unroll
        for (int t = 0; t < BLOCK_N; ++t) m_blk = fmaxf(m_blk, s_s[t]);
        const float m_new = fmaxf(m, m_blk);
#ifdef ATTN_DEFECT_NO_NEGINF_GUARD
        const float m_use = m_new;                                // -inf - (-inf) = NaN
#else
        const float m_use = (m_new == ATTN_NEG_INF) ? 0.0f : m_new;  // -inf - (-inf) contributes 0
#endif
        const float alpha = expf(m - m_use);
        if (tid < BLOCK_N) {
            const float p = expf(s_s[tid] - m_use);
            pl_s[tid] = p;
            p_s[tid] = AttnTypes<T>::quantized ? __half2float(__float2half(p)) : p;
        }
        __syncthreads();
        float psum = 0.0f;
#pragma unroll
        for (int t = 0; t < BLOCK_N; ++t) psum += pl_s[t];
        l = l * alpha + psum;
        m = m_new;
        const int n_keys = min(BLOCK_N, last_key + 1 - j0);   // keys past L_b are not read
#pragma unroll
        for (int a = 0; a < ACC_N; ++a) {
            const int d = tid + a * NT;
            if (d < dv) {
                float sum = acc[a] * alpha;
                const out_t* vc = vp + (long long)d * v_sd + (long long)j0 * v_ss;
                for (int t = 0; t < n_keys; ++t) sum += p_s[t] * attn_to_float(vc[(long long)t * v_ss]);
                acc[a] = sum;
            }
        }
        // No barrier needed here: the next writes of part_s / s_s / p_s happen after the
        // next iteration's first barrier, which every thread reaches only after this point.
    }

    // 4. final scaling of this split.
#ifdef ATTN_DEFECT_NO_ZERO_SUM_GUARD
    const bool empty = false;                                     // acc / 0 = NaN
#else
    const bool empty = (l == 0.0f);                               // l == 0 stores 0
#endif
    const float inv_l = empty ? 0.0f : 1.0f / l;
    const float lse_val = empty ? ATTN_NEG_INF : m + logf(l);

    if (write_partials) {
        float* op = o_part + ((long long)split * rows + row) * (long long)dv;
#pragma unroll
        for (int a = 0; a < ACC_N; ++a) {
            const int d = tid + a * NT;
            if (d < dv) op[d] = empty ? 0.0f : acc[a] * inv_l;
        }
        if (tid == 0) lse_part[(long long)split * rows + row] = lse_val;
    } else {
        out_t* op = o + (long long)b * o_sb + (long long)h * o_sh + (long long)qi * o_ss;
#pragma unroll
        for (int a = 0; a < ACC_N; ++a) {
            const int d = tid + a * NT;
            if (d < dv) op[(long long)d * o_sd] = attn_from_float<out_t>(empty ? 0.0f : acc[a] * inv_l);
        }
        if (lse && tid == 0) lse[row] = attn_from_float<lse_t>(lse_val);
    }
}

// ---- the combine kernel --------------------------------------------------------------------
template <typename OT, typename LT, int NT>
__global__ void __launch_bounds__(NT) attn_splitkv_combine(
    const float* __restrict__ o_part, const float* __restrict__ lse_part,
    OT* __restrict__ o, LT* __restrict__ lse,
    int g, int hq, int sq, int dv,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd,
    int num_splits)
{
    const int tid = (int)threadIdx.x;
    const long long row = (long long)blockIdx.x;
    const long long rows = (long long)g * hq * sq;
    const int qi = (int)(row % sq);
    const long long bh = row / sq;
    const int h = (int)(bh % hq);
    const int b = (int)(bh / hq);

    // Every split is weighted, valid or not: invalid and empty splits must carry LSE_s = -inf.
    float M = -ATTN_FLT_MAX;
    for (int s = 0; s < num_splits; ++s) M = fmaxf(M, lse_part[(long long)s * rows + row]);
    float den = 0.0f;
    for (int s = 0; s < num_splits; ++s) den += expf(lse_part[(long long)s * rows + row] - M);
    // den == 0 only when every split is -inf; a NaN den propagates (a defect must show).
    const bool zero = (den == 0.0f);

    OT* op = o + (long long)b * o_sb + (long long)h * o_sh + (long long)qi * o_ss;
    for (int d = tid; d < dv; d += NT) {
        float num = 0.0f;
        for (int s = 0; s < num_splits; ++s) {
            const float w = expf(lse_part[(long long)s * rows + row] - M);
            num += w * o_part[((long long)s * rows + row) * (long long)dv + d];
        }
        op[(long long)d * o_sd] = attn_from_float<OT>(zero ? 0.0f : num / den);
    }
    if (lse && tid == 0) lse[row] = attn_from_float<LT>(zero ? ATTN_NEG_INF : M + logf(den));
}
