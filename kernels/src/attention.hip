// attention.hip — split-KV (flash-decoding) attention forward and its combine (docs/spec.md §1–§3).
//
// One source for ROCm (hiprtc) and NVIDIA (NVRTC) through hip_compat.h. Three forward kernels
// with one contract: attn_splitkv_fwd (rowwise: any dtype and head dim, the reference-like
// scalar kernel), attn_splitkv_fwd_grouped (GQA rows share a K/V pass; f16/bf16/f32, dims
// <= 256) and, on NVIDIA sm_80+ only, attn_splitkv_fwd_mma (tensor cores; f16/bf16). All
// accumulate in f32 (int32 for i8). kernels/select.py picks one per config.
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
// Split boundaries (docs/spec.md §3) depend on the batch entry only: L_b = current_seq_len[b] or Sk-1,
// n_blocks = (L_b + BLOCK_N) / BLOCK_N, blocks_per_split = ceil(n_blocks / S), split s covers
// blocks [s*bps, min((s+1)*bps, n_blocks)). An empty split or a split with no visible key for a
// row writes O_s = 0, LSE_s = -inf.
//
// Defect switches (each re-introduces one bug of rocMLIR's split-KV history, see
// kernels/backends/base.py DEFECTS):
//   ATTN_DEFECT_NO_NEGINF_GUARD        exp(m_old - m_new) and exp(s - m_new) with m_new = -inf
//   ATTN_DEFECT_FLOOR_BLOCKS_PER_SPLIT blocks_per_split = n_blocks / S (floor)
//   ATTN_DEFECT_NO_ZERO_SUM_GUARD      O_s = acc / l without the l == 0 guard
//   ATTN_DEFECT_CAUSAL_OFF_BY_ONE      causal mask hides key j == q + prefix
// and four that a sweep must survive and attribute (the combine kernel only, which every
// variant built with one of them launches: kernels/launch.py fuses_combine):
//   ATTN_DEFECT_OOB_STORE              the last row's output stored 1 TiB past O (illegal address)
//   ATTN_DEFECT_OOB_STORE_SMALL        the last row's last value stored 2 elements past O's end
//   ATTN_DEFECT_MISSING_BARRIER        thread groups' sums read without the barrier (a race)
//   ATTN_DEFECT_HANG                   the last row's block spins forever
#include "hip_compat.h"

#ifndef ATTN_MAX_HEAD_DIM
#define ATTN_MAX_HEAD_DIM 1024
#endif

// ---- split boundaries and the causal bound, shared by every split kernel -----------------------
// The blocks of BLOCK_N keys that split `split` of batch entry b reads: [blk_begin, blk_end), of
// n_blocks up to key last_key (above). The rowwise kernel starts at split * blocks_per_split
// unclamped (`clamp` false: a split past the last block is empty either way).
struct AttnSplitRange { int last_key, n_blocks, blk_begin, blk_end; };

template <int BLOCK_N, bool clamp>
__device__ __forceinline__ AttnSplitRange attn_split_range(const int* __restrict__ current_seq_len, int b, int sk,
                                                           int split, int num_splits) {
    AttnSplitRange r;
    r.last_key = current_seq_len ? current_seq_len[b] : sk - 1;
    r.n_blocks = (r.last_key + BLOCK_N) / BLOCK_N;
#ifdef ATTN_DEFECT_FLOOR_BLOCKS_PER_SPLIT
    const int blocks_per_split = r.n_blocks / num_splits;
#else
    const int blocks_per_split = (r.n_blocks + num_splits - 1) / num_splits;
#endif
    r.blk_begin = clamp ? min(split * blocks_per_split, r.n_blocks) : split * blocks_per_split;
    r.blk_end = min(r.blk_begin + blocks_per_split, r.n_blocks);
    return r;
}

// Row qi of a batch entry whose prefix offset is `prefix` sees keys j <= qi + attn_causal_shift(prefix).
__device__ __forceinline__ long long attn_causal_shift(long long prefix) {
#ifdef ATTN_DEFECT_CAUSAL_OFF_BY_ONE
    return prefix - 1;
#else
    return prefix;
#endif
}

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
    const AttnSplitRange range = attn_split_range<BLOCK_N, false>(current_seq_len, b, sk, split, num_splits);
    const int last_key = range.last_key;
    const int blk_begin = range.blk_begin, blk_end = range.blk_end;

    // Causal bound of this row: key j is visible iff j <= causal_last.
    long long causal_last = (long long)last_key;
    if (causal) {
        const long long prefix = prefix_offset ? (long long)prefix_offset[b] : 0;
        causal_last = (long long)qi + attn_causal_shift(prefix);
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

// ---- the grouped split kernel (the fast path) ----------------------------------------------
// attn_splitkv_fwd_grouped<T, DQK_B, DV_B, BLOCK_N, NT, RB>: the same contract, arguments and
// outputs as attn_splitkv_fwd, for f16/bf16/f32 with head dims up to 256. Decoding is memory
// bound and GQA shares each K/V row between hq/hkv query heads, so one block serves RB query
// rows of one kv head (rows (h, qi) of that head, head-major) and reads each K and V row of its
// split once, with 16-byte loads where the layout allows:
//   grid  = (g * hkv * ceil(hq/hkv * sq / RB), S), block = NT threads.
// Per tile of NT keys: (1) thread t computes the RB logits of key t (its K row against the RB
// query rows in shared memory), (2) NT/RB threads per row update the running max and sum,
// (3) thread (dg, kg) accumulates P.V over keys kg, kg+KG, ... for its VEC value dims.
// The key groups' accumulators are summed once at the end of the split. Split boundaries,
// masks, guards and defect switches are those of attn_splitkv_fwd.
template <typename T> struct AttnVec { static constexpr int n = 16 / (int)sizeof(T); };

// Tuning knobs of the grouped path (tools/tune_grouped.py measures them; the defaults won):
// blocks per SM the register budget must allow, and rows a thread loads before using them.
#ifndef ATTN_GROUPED_MIN_BLOCKS
#define ATTN_GROUPED_MIN_BLOCKS 3
#endif
#ifndef ATTN_GROUPED_UNROLL
#define ATTN_GROUPED_UNROLL 4
#endif

// VEC elements of a row, as stored; one 16-byte load when `vec` says the row is contiguous and
// 16-byte aligned and the whole piece is inside the row, else element by element (zero past dmax).
template <typename T, int VEC> struct alignas(16) AttnPack { T v[VEC]; };

// The element-by-element case (transposed layouts, ragged head dims) out of line: unrolled in
// place it would cost the fast case its registers.
template <typename T, int VEC>
__device__ __noinline__ AttnPack<T, VEC> attn_gather_pack(const T* p, long long sd, int d0, int dmax) {
    AttnPack<T, VEC> x;
#pragma unroll
    for (int e = 0; e < VEC; ++e) x.v[e] = (d0 + e < dmax) ? p[(long long)(d0 + e) * sd] : attn_from_float<T>(0.0f);
    return x;
}

template <typename T, int VEC>
__device__ __forceinline__ void attn_load_pack(AttnPack<T, VEC>& x, const T* p, long long sd, int d0, int dmax, bool vec) {
    if (vec && d0 + VEC <= dmax) x = *reinterpret_cast<const AttnPack<T, VEC>*>(p + d0);
    else x = attn_gather_pack<T, VEC>(p, sd, d0, dmax);
}

template <typename T, int DQK_B, int DV_B, int BLOCK_N, int NT, int RB>
__global__ void __launch_bounds__(NT, ATTN_GROUPED_MIN_BLOCKS) attn_splitkv_fwd_grouped(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ bias, T* __restrict__ o, float* __restrict__ lse,
    float* __restrict__ o_part, float* __restrict__ lse_part,
    const int* __restrict__ prefix_offset, const int* __restrict__ current_seq_len,
    int g, int hq, int hkv, int sq, int sk, int dqk, int dv,
    long long q_sb, long long q_sh, long long q_ss, long long q_sd,
    long long k_sb, long long k_sh, long long k_ss, long long k_sd,
    long long v_sb, long long v_sh, long long v_ss, long long v_sd,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd,
    int num_splits, int write_partials, int causal, float qk_scale,
    float quant_scale, int quant_zero_point)
{
    constexpr int VEC = AttnVec<T>::n;
    constexpr int DG = (DV_B + VEC - 1) / VEC;      // value-dim groups of VEC
    constexpr int KG = NT / DG;                     // key groups in the P.V phase
    constexpr int TPR = NT / RB;                    // threads per row in the softmax phase
    constexpr int LK = (DQK_B / VEC) < 32 ? (DQK_B / VEC) : 32;   // lanes sharing one K row
    constexpr int NVK = DQK_B / (VEC * LK);         // 16-byte pieces of a K row per lane
    constexpr int KKG = NT / LK;                    // key groups in the logits phase
    constexpr int UK = (LK < ATTN_GROUPED_UNROLL ? LK : ATTN_GROUPED_UNROLL) / NVK;  // K rows in flight per lane
    constexpr int UV = DG < ATTN_GROUPED_UNROLL ? DG : ATTN_GROUPED_UNROLL;         // V rows in flight per thread
    static_assert(DQK_B > 0 && DQK_B <= 256 && DV_B > 0 && DV_B <= 256, "grouped path: head dims <= 256");
    static_assert(NT % DG == 0 && KG >= 1 && NT % RB == 0, "grouped path: NT must split into groups");

    __shared__ float s_s[RB][NT];          // logits, then probabilities, of the current tile
    __shared__ float m_s[RB], l_s[RB], alpha_s[RB];
    __shared__ float red_s[KG][RB][DV_B];  // key groups' accumulators, summed at the end

    const int tid = (int)threadIdx.x;
    const int ratio = hq / hkv;
    const int rows_per_kv = ratio * sq;
    const int groups = (rows_per_kv + RB - 1) / RB;
    const int grp = (int)(blockIdx.x % (unsigned)groups);
    const long long bk = (long long)(blockIdx.x / (unsigned)groups);   // b * hkv + kvh
    const int kvh = (int)(bk % hkv);
    const int b = (int)(bk / hkv);
    const int split = (int)blockIdx.y;
    const long long rows = (long long)g * hq * sq;

    const AttnSplitRange range = attn_split_range<BLOCK_N, true>(current_seq_len, b, sk, split, num_splits);
    const int key_begin = range.blk_begin * BLOCK_N;
    const int key_end = min(range.blk_end * BLOCK_N, range.last_key + 1);
    const long long prefix = (causal && prefix_offset) ? (long long)prefix_offset[b] : 0;

    // The block's rows: row i is query head kvh*ratio + rr / sq at position rr % sq. Each lane
    // keeps its slice of the rows' (scaled) queries in registers.
    const int lk = tid % LK, kk = tid / LK;
    float qr[RB][NVK][VEC];
#pragma unroll
    for (int i = 0; i < RB; ++i) {
        const int rr = grp * RB + i;
        const int h = kvh * ratio + rr / sq, qi = rr % sq;
        const T* qp = q + (long long)b * q_sb + (long long)h * q_sh + (long long)qi * q_ss;
#pragma unroll
        for (int n = 0; n < NVK; ++n)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int d = (n * LK + lk) * VEC + e;
                qr[i][n][e] = (rr < rows_per_kv && d < dqk) ? attn_to_float(qp[(long long)d * q_sd]) * qk_scale : 0.0f;
            }
    }
    const long long causal_shift = attn_causal_shift(prefix);   // row qi sees keys j <= qi + causal_shift
    if (tid < RB) { m_s[tid] = ATTN_NEG_INF; l_s[tid] = 0.0f; }

    const T* kp = k + (long long)b * k_sb + (long long)kvh * k_sh;
    const T* vp = v + (long long)b * v_sb + (long long)kvh * v_sh;
    const bool k_vec = k_sd == 1 && k_ss % VEC == 0 && k_sh % VEC == 0 && k_sb % VEC == 0;
    const bool v_vec = v_sd == 1 && v_ss % VEC == 0 && v_sh % VEC == 0 && v_sb % VEC == 0;
    const int dg = tid % DG, kg = tid / DG;
    float acc[RB][VEC];
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[i][e] = 0.0f;
    __syncthreads();

    // Tiles past a causal group's last visible key are walked anyway, as rocMLIR's kernel did:
    // skipping them would hide the -inf - (-inf) defect from most causal configs.
    for (int j0 = key_begin; j0 < key_end; j0 += NT) {
        // (1) logits: lanes lk of key group kk read 16-byte pieces of one K row (coalesced) and
        //     dot them with their slice of the RB query rows; a shuffle sum over the LK lanes.
#pragma unroll 1
        for (int c0 = 0; c0 < LK; c0 += UK) {
            AttnPack<T, VEC> kx[UK][NVK];
#pragma unroll
            for (int u = 0; u < UK; ++u) {
                const int j = j0 + kk + (c0 + u) * KKG;
                const T* kr = kp + (long long)min(j, key_end - 1) * k_ss;
#pragma unroll
                for (int n = 0; n < NVK; ++n) {
                    const int d0 = (n * LK + lk) * VEC;
                    attn_load_pack<T, VEC>(kx[u][n], kr, k_sd, d0, (j < key_end) ? dqk : 0, k_vec);
                }
            }
#pragma unroll
            for (int u = 0; u < UK; ++u) {
                const int t = kk + (c0 + u) * KKG;
                const int j = j0 + t;
                float s[RB];
#pragma unroll
                for (int i = 0; i < RB; ++i) {
                    float x = 0.0f;
#pragma unroll
                    for (int n = 0; n < NVK; ++n)
#pragma unroll
                        for (int e = 0; e < VEC; ++e) x += qr[i][n][e] * attn_to_float(kx[u][n].v[e]);
#pragma unroll
                    for (int w = LK / 2; w > 0; w /= 2) x += ATTN_SHFL_XOR(x, w);
                    s[i] = x;
                }
                if (lk == 0) {
#pragma unroll
                    for (int i = 0; i < RB; ++i) {
                        const int rr = grp * RB + i;
                        float x = ATTN_NEG_INF;
                        if (j < key_end && rr < rows_per_kv) {
                            const int qi = rr % sq;
                            if (!causal || (long long)j <= (long long)qi + causal_shift) {
                                x = s[i];
                                if (bias) {
                                    const long long row = ((long long)b * hq + kvh * ratio + rr / sq) * sq + qi;
                                    x += attn_to_float(bias[row * (long long)sk + j]);
                                }
                            }
                        }
                        s_s[i][t] = x;
                    }
                }
            }
        }
        __syncthreads();
        // (2) running max and sum of each row; probabilities in place of the logits.
        {
            const int i = tid / TPR, part = tid % TPR;
            __shared__ float part_s[NT];
            float mx = ATTN_NEG_INF;
            for (int t = part; t < NT; t += TPR) mx = fmaxf(mx, s_s[i][t]);
            part_s[tid] = mx;
            __syncthreads();
            if (part == 0) {
                float m_blk = ATTN_NEG_INF;
                for (int t = 0; t < TPR; ++t) m_blk = fmaxf(m_blk, part_s[i * TPR + t]);
                const float m_old = m_s[i];
                const float m_new = fmaxf(m_old, m_blk);
#ifdef ATTN_DEFECT_NO_NEGINF_GUARD
                const float m_use = m_new;
#else
                const float m_use = (m_new == ATTN_NEG_INF) ? 0.0f : m_new;
#endif
                alpha_s[i] = expf(m_old - m_use);
                m_s[i] = m_new;
                part_s[i * TPR] = m_use;     // read back below as the row's subtrahend
            }
            __syncthreads();
            const float m_use = part_s[i * TPR];
            float sum = 0.0f;
            for (int t = part; t < NT; t += TPR) {
                const float p = expf(s_s[i][t] - m_use);
                s_s[i][t] = p;
                sum += p;
            }
            __syncthreads();
            part_s[tid] = sum;
            __syncthreads();
            if (part == 0) {
                float tot = 0.0f;
                for (int t = 0; t < TPR; ++t) tot += part_s[i * TPR + t];
                l_s[i] = l_s[i] * alpha_s[i] + tot;
            }
        }
        // (3) P.V for value dims [dg*VEC, dg*VEC + VEC) over keys kg, kg + KG, ...
        {
#pragma unroll
            for (int i = 0; i < RB; ++i) {
                const float a = alpha_s[i];
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc[i][e] *= a;
            }
            const int n_keys = min(NT, key_end - j0);
            const int d0 = dg * VEC;
            if (d0 < dv) {
                const bool whole = v_vec && d0 + VEC <= dv;
#pragma unroll 1
                for (int c0 = 0; c0 < DG; c0 += UV) {
                    AttnPack<T, VEC> vx[UV];
#pragma unroll
                    for (int u = 0; u < UV; ++u) {
                        const int t = kg + (c0 + u) * KG;
                        if (t < n_keys) attn_load_pack<T, VEC>(vx[u], vp + (long long)(j0 + t) * v_ss, v_sd, d0, dv, whole);
                    }
#pragma unroll
                    for (int u = 0; u < UV; ++u) {
                        const int t = kg + (c0 + u) * KG;
                        if (t < n_keys) {
#pragma unroll
                            for (int i = 0; i < RB; ++i) {
                                const float p = s_s[i][t];
#pragma unroll
                                for (int e = 0; e < VEC; ++e) acc[i][e] += p * attn_to_float(vx[u].v[e]);
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();   // s_s and alpha_s are rewritten by the next tile
    }

    // Sum the key groups' accumulators, then the final scaling of this split.
#pragma unroll
    for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            if (dg * VEC + e < DV_B) red_s[kg][i][dg * VEC + e] = acc[i][e];
    __syncthreads();
    for (int x = tid; x < RB * DV_B; x += NT) {
        const int i = x / DV_B, d = x % DV_B;
        const int rr = grp * RB + i;
        if (rr >= rows_per_kv || d >= dv) continue;
        float a = 0.0f;
        for (int t = 0; t < KG; ++t) a += red_s[t][i][d];
        const float l = l_s[i];
#ifdef ATTN_DEFECT_NO_ZERO_SUM_GUARD
        const bool empty = false;
#else
        const bool empty = (l == 0.0f);
#endif
        const float val = empty ? 0.0f : a / l;
        const int h = kvh * ratio + rr / sq, qi = rr % sq;
        const long long row = ((long long)b * hq + h) * sq + qi;
        if (write_partials) {
            o_part[((long long)split * rows + row) * (long long)dv + d] = val;
            if (d == 0) lse_part[(long long)split * rows + row] = empty ? ATTN_NEG_INF : m_s[i] + logf(l);
        } else {
            o[(long long)b * o_sb + (long long)h * o_sh + (long long)qi * o_ss + (long long)d * o_sd] = attn_from_float<T>(val);
            if (lse && d == 0) lse[row] = empty ? ATTN_NEG_INF : m_s[i] + logf(l);
        }
    }
}

// ---- the fused combine of the tensor-core decode kernel ----------------------------------
// Plain device code, compiled with that kernel and by the host emulation, whose tests run it.
#if defined(ATTN_HAVE_MMA_SM80) || defined(ATTN_HOST_EMULATION)

// Combines `count` partials of one row tile, `step` rows apart (in_o / in_lse: the first one's
// row 0), as attn_splitkv_combine does (no validity mask, M = -FLT_MAX when every LSE_s is
// -inf, O = 0 and LSE = -inf on a zero denominator). final: into O and LSE; otherwise into the
// partial at out_o / out_lse (row 0), normalized with its LSE like a split's. Of the kv head's
// rows (head-major: row rr is head h0 + rr / sq, query rr % sq), this tile holds first_row..
// first_row + BM - 1; those below rows_per_kv are real.
// A thread takes four value dims of one row and reads, for up to C partials at
// once, their LSEs and its four dims together, into registers: one round trip to L2 per chunk,
// no shared memory and no barrier (staging the LSEs and weights in shared memory behind two
// barriers made a level slower). Past one
// chunk the running maximum rescales, as the split kernel's online softmax does. Partials are
// read past L1 (__ldcg): other SMs wrote them.
// One copy of the code for both levels (not inlined). C partials a round trip, chosen by the
// caller per head dim (attn_splitkv_fwd_mma: COMBINE_CHUNK): four make a level faster than
// sixteen, except in the D = 256 decode kernel, which runs at the register limit: there four
// spill more and run slower, so it takes sixteen. The timings: docs/decisions.md, "Decode's
// fixed costs: the combine".
template <typename T, int BM, int NT, int C>
__device__ __noinline__ void attn_combine_tile(
    const float* in_o, const float* in_lse, int count, long long step,
    bool final, T* __restrict__ o, float* __restrict__ lse, float* out_o, float* out_lse,
    int first_row, int rows_per_kv, int h0, int b, int hq, int sq, int dv,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd)
{
    const int nreal = min(BM, rows_per_kv - first_row);
    const int dv4 = dv / 4;    // dv is a multiple of 8 on this path: 16-byte loads
    for (int i = (int)threadIdx.x; i < nreal * dv4; i += NT) {
        const int r = i / dv4, d = (i % dv4) * 4;
        const int rr = first_row + r;
        const int h = h0 + rr / sq, qi = rr % sq;
        const long long row = ((long long)b * hq + h) * sq + qi;
        const float* op = in_o + row * dv + d;
        float mx = -ATTN_FLT_MAX, den = 0.0f;   // fmaxf skips a NaN LSE_s, whose weight then shows it
        float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int c0 = 0; c0 < count; c0 += C) {
            const int n = min(C, count - c0);
            float ls[C];
            float4 x[C];
#pragma unroll
            for (int j = 0; j < C; ++j) {
                if (j < n) {
                    ls[j] = __ldcg(in_lse + (long long)(c0 + j) * step + row);
                    x[j] = __ldcg(reinterpret_cast<const float4*>(op + (long long)(c0 + j) * step * dv));
                }
            }
            float m2 = mx;
#pragma unroll
            for (int j = 0; j < C; ++j)
                if (j < n) m2 = fmaxf(m2, ls[j]);
            const float sc = expf(mx - m2);   // 1 in the first chunk (both -FLT_MAX or mx == m2)
            den *= sc; num.x *= sc; num.y *= sc; num.z *= sc; num.w *= sc;
#pragma unroll
            for (int j = 0; j < C; ++j) {
                if (j < n) {
                    const float w = expf(ls[j] - m2);
                    den += w;
                    num.x += w * x[j].x; num.y += w * x[j].y; num.z += w * x[j].z; num.w += w * x[j].w;
                }
            }
            mx = m2;
        }
        const bool zero = den == 0.0f;
        if (d == 0 && (lse || !final))
            (final ? lse : out_lse)[row] = zero ? ATTN_NEG_INF : mx + logf(den);
        if (!final) {
            *reinterpret_cast<float4*>(out_o + row * dv + d) =
                zero ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : make_float4(num.x / den, num.y / den, num.z / den, num.w / den);
            continue;
        }
        T* out = o + (long long)b * o_sb + (long long)h * o_sh + (long long)qi * o_ss + (long long)d * o_sd;
        out[0] = attn_from_float<T>(zero ? 0.0f : num.x / den);
        out[o_sd] = attn_from_float<T>(zero ? 0.0f : num.y / den);
        out[2 * o_sd] = attn_from_float<T>(zero ? 0.0f : num.z / den);
        out[3 * o_sd] = attn_from_float<T>(zero ? 0.0f : num.w / den);
    }
}

// The combine fused into the split kernel (combine_count set: the host's fuses_combine), with
// no block waiting on another. Called by every thread of a block after its partials are written
// and a barrier. Splits come in groups of `group` (the host's fused_combine_group): the last block
// of a group to finish, counted by an atomic per (row tile, group), combines the group. With one
// group that is the whole combine (O and LSE). With several, it writes the group's result as a
// partial of its own into group_part, and the last of the groups' combiners, counted by one more
// atomic per row tile, combines those. Two levels of about sqrt(splits) reads each, not one
// block reading every split (or the combine kernel's launch); the splits' partials stay as the
// split kernel wrote them, for the verifier. Each counter is zeroed by the block that saw itself
// last, for the next launch. Not inlined: it runs once per block and must not take registers
// from the main loop.
// Ordering, as cooperative groups' grid barrier does it: the block's barrier, then thread 0 alone
// fences (releasing what every thread of the block wrote) before its atomic, and the block that
// comes last fences again (acquiring) before the barrier that lets its threads read. (A fence in
// every thread is slower: docs/decisions.md, "Decode's fixed costs: the combine".)
// combine_count: per row tile, one counter (one group) or groups + 1. group_part (several
// groups): O [groups][rows][dv], then LSE [groups][rows]. smem: one int.
template <typename T, int BM, int NT, int C>
__device__ __noinline__ void attn_fused_combine(
    unsigned char* smem, const float* o_part, const float* lse_part,
    T* __restrict__ o, float* __restrict__ lse, int* __restrict__ combine_count, float* group_part,
    int first_row, int rows_per_kv, int h0, int b, int hq, int sq, int dv, long long rows,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd, int num_splits, int group)
{
    const int tid = (int)threadIdx.x;
    int* last_s = reinterpret_cast<int*>(smem);
    const int groups = (num_splits + group - 1) / group;
    int* count = combine_count + (long long)blockIdx.x * (groups > 1 ? groups + 1 : 1);
    const int gi = (int)blockIdx.y / group, first = gi * group, members = min(group, num_splits - first);
    if (tid == 0) {
        __threadfence();                  // this block's partials, before it counts
        const bool last = atomicAdd(&count[gi], 1) == members - 1;
        if (last) __threadfence();        // every member's partials, before this block reads them
        last_s[0] = last;
    }
    __syncthreads();
    if (!last_s[0]) return;
    if (groups == 1) {
        attn_combine_tile<T, BM, NT, C>(o_part, lse_part, num_splits, rows, true, o, lse, nullptr, nullptr,
                                     first_row, rows_per_kv, h0, b, hq, sq, dv, o_sb, o_sh, o_ss, o_sd);
        if (tid == 0) count[0] = 0;
        return;
    }
    float* group_lse = group_part + (long long)groups * rows * dv;
    attn_combine_tile<T, BM, NT, C>(o_part + (long long)first * rows * dv, lse_part + (long long)first * rows,
                                 members, rows, false, o, lse, group_part + (long long)gi * rows * dv,
                                 group_lse + (long long)gi * rows,
                                 first_row, rows_per_kv, h0, b, hq, sq, dv, o_sb, o_sh, o_ss, o_sd);
    __syncthreads();                      // the group's partial is written, and last_s read
    if (tid == 0) {
        count[gi] = 0;
        __threadfence();                  // the group's partial, before it counts
        const bool last = atomicAdd(&count[groups], 1) == groups - 1;
        if (last) __threadfence();
        last_s[0] = last;
    }
    __syncthreads();
    if (!last_s[0]) return;
    attn_combine_tile<T, BM, NT, C>(group_part, group_lse, groups, rows, true, o, lse, nullptr, nullptr,
                                 first_row, rows_per_kv, h0, b, hq, sq, dv, o_sb, o_sh, o_ss, o_sd);
    if (tid == 0) count[groups] = 0;
}
#endif

// ---- the tensor-core split kernel (NVIDIA sm_80 and newer) ---------------------------------
// attn_splitkv_fwd_mma<T, DQK_B, DV_B, BLOCK_N, BN, WM, WN, MINB>: the same contract,
// arguments and outputs as attn_splitkv_fwd, for f16/bf16 with head dims that are multiples of 8
// up to 256, Q/K/V rows contiguous and 16-byte aligned (no transposed Q, K or V). An
// architecture-specific fast path (mma.sync m16n8k16 with f32 accumulators, ldmatrix, cp.async):
// the grouped and rowwise kernels above stay the portable path, and the host picks this one only
// on NVIDIA GPUs of compute capability 8.0 or newer (kernels/select.py).
//   grid  = (g * hkv * ceil(hq/hkv * sq / (16*WM)), S), block = 32*WM*WN threads,
//   dynamic shared memory = AttnMmaSmem<...>::bytes (the host computes the same: Variant.shared_bytes;
//   past 48 KB it opts the kernel in, up to 99 KB).
// A block serves 16*WM rows of one kv head (the grouped path's head-major packing: decode's
// GQA rows share one K/V pass), warp (wm, wn) the 16-row tile from 16*wm on and, of every tile
// of BN keys, the keys wn*BN/WN..: prefill runs WM = 4 warps of one row tile, decode WN key groups
// (MMA_DECODE_SHAPES) whose softmax states merge once at the end. K and V tiles go to shared
// memory by cp.async, V of tile t while S = Q.K^T of tile t is computed and K of tile t+1 while
// P.V of tile t is, as FlashAttention 2 does. (A ring of 2 to 6 K/V stages for decode is no
// faster: docs/decisions.md, "The tensor-core path".) Decode's last blocks to finish also do the
// combine (attn_fused_combine, above). P is rounded to T for P.V (docs/spec.md §1 allows it); l
// sums the f32 P. MINB is the blocks per SM the register budget must allow
// (__launch_bounds__). Split boundaries, masks, guards and defect switches are those of
// attn_splitkv_fwd.
// The host emulation (host_emu.h) runs this kernel too: it supplies the primitives below
// (ldmatrix, mma.sync, cp.async, the packing of P, the dynamic shared memory) with the PTX
// ISA's fragment layouts, so the unit tests check this kernel's arithmetic without a GPU.
#if defined(ATTN_HAVE_MMA_SM80) || defined(ATTN_HOST_EMULATION)
#if defined(ATTN_HAVE_MMA_SM80)

__device__ __forceinline__ unsigned attn_smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !valid.
// The L2 fetches ATTN_CP_L2_PREFETCH bytes (128 or 256; 0: no hint) around each miss. 128, as
// CUTLASS's SM80 cp.async does: decode is faster with the hint (docs/decisions.md, "The
// tensor-core path").
#ifndef ATTN_CP_L2_PREFETCH
#define ATTN_CP_L2_PREFETCH 128
#endif
#if ATTN_CP_L2_PREFETCH == 256
#define ATTN_CP_ASYNC "cp.async.cg.shared.global.L2::256B"
#elif ATTN_CP_L2_PREFETCH == 128
#define ATTN_CP_ASYNC "cp.async.cg.shared.global.L2::128B"
#else
#define ATTN_CP_ASYNC "cp.async.cg.shared.global"
#endif
__device__ __forceinline__ void attn_cp_async16(void* dst, const void* src, bool valid) {
    asm volatile(ATTN_CP_ASYNC " [%0], [%1], 16, %2;\n"
                 :: "r"(attn_smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void attn_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void attn_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void attn_ldsm_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(attn_smem_addr(p)) : "memory");
}
__device__ __forceinline__ void attn_ldsm_x4_trans(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(attn_smem_addr(p)) : "memory");
}

// c += a.b for a 16x16 (row) by 16x8 (col) product, f32 accumulators.
__device__ __forceinline__ void attn_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, __half) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void attn_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, __hip_bfloat16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x, approximate (ex2.approx, as __expf uses after its multiply by log2 e).
__device__ __forceinline__ float attn_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two floats rounded to T, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ unsigned attn_pack2(float a, float b, __half) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ unsigned attn_pack2(float a, float b, __hip_bfloat16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ unsigned attn_dynamic_smem_size() {
    unsigned have;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
    return have;
}

extern __shared__ __align__(16) unsigned char attn_mma_smem[];
#endif  // ATTN_HAVE_MMA_SM80 (the host emulation's versions: host_emu.h)

// 1: the key groups' merge slots pad each row of O by 8 floats and move two floats at a time.
// Unpadded (0, to compare), the 8 rows a warp writes or reads at once start in the same bank: an
// 8-way conflict on every access at the end of every decode block (the cycles it costs:
// docs/decisions.md, "Decode's fixed costs: the combine").
#ifndef ATTN_MMA_MERGE_PAD
#define ATTN_MMA_MERGE_PAD 1
#endif
// From DQK bucket ATTN_MMA_Q_SMEM_FROM on (the host passes kernels/tuning.py MMA_Q_SMEM_FROM),
// Q's A fragments are read from shared memory at every tile instead of held in registers (64 of
// them a thread at 256). The D = 256 kernels run at the register limit: with them in registers
// the decode one spills 128 bytes, the prefill one 420 (ptxas -v, sm_90); from shared memory 0 and 116.
// ATTN_MMA_Q_SMEM=0 keeps them in registers everywhere (to compare; the host reserves as before).
#ifndef ATTN_MMA_Q_SMEM
#define ATTN_MMA_Q_SMEM 1
#endif
#ifndef ATTN_MMA_Q_SMEM_FROM
#define ATTN_MMA_Q_SMEM_FROM 256
#endif
// 1: the softmax's exponentials as FlashAttention 2 takes them, p = 2^(s·(scale·log2 e) − m·log2 e):
// one FFMA and one ex2 a score where __expf(s·scale − m) takes a multiply, a subtract, a multiply
// and the ex2, and where every key of a row is visible its maximum is taken on the unscaled scores
// (the scale is positive). m stays in natural-log units, so the merges and the LSE are as before.
// Prefill's softmax is most of the instructions its tiles issue beside the mma and ldmatrix
// (docs/decisions.md). kernels/tuning.py MMA_PREFILL_TABLE turns it on where it is faster
// (prefill, head dims summing to 128 or less); at D = 128 it spills and is slower.
#ifndef ATTN_MMA_EXP2
#define ATTN_MMA_EXP2 0
#endif
#define ATTN_LOG2E 1.4426950408889634f
template <int DQK_B, int DV_B, int BN, int WM, int WN>
struct AttnMmaSmem {
    static constexpr bool q_in_smem = ATTN_MMA_Q_SMEM && DQK_B >= ATTN_MMA_Q_SMEM_FROM;
    static constexpr int q = q_in_smem ? 16 * WM * (DQK_B + 8) * 2 : 0;   // the rows of Q, as K's
    static constexpr int tiles = BN * (DQK_B + 8 + DV_B + 8) * 2 + q;
    static constexpr int merge = (WN / 2) * WM * (32 + 16 * (DV_B + (ATTN_MMA_MERGE_PAD ? 8 : 0))) * 4;
    static constexpr int bytes = tiles > merge ? tiles : merge;
};

// Element offset of 16-byte chunk c of shared row r: swizzled (chunk c ^ (r & 7), the row
// unpadded) or at its place in a padded row; the loader and both readers go through here.
__device__ __forceinline__ int attn_smem_chunk(int r, int c, int stride, bool swizzled) {
    return r * stride + (swizzled ? c ^ (r & 7) : c) * 8;
}

// 1: K and V tiles with rows of 8, 16 or 32 chunks are stored swizzled, not padded (below).
#ifndef ATTN_MMA_SWIZZLE
#define ATTN_MMA_SWIZZLE 1
#endif
template <typename T, int DQK_B, int DV_B, int BLOCK_N, int BN, int WM, int WN, int MINB>
__global__ void __launch_bounds__(32 * WM * WN, MINB) attn_splitkv_fwd_mma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ bias, T* __restrict__ o, float* __restrict__ lse,
    float* __restrict__ o_part, float* __restrict__ lse_part,
    const int* __restrict__ prefix_offset, const int* __restrict__ current_seq_len,
    int g, int hq, int hkv, int sq, int sk, int dqk, int dv,
    long long q_sb, long long q_sh, long long q_ss, long long q_sd,
    long long k_sb, long long k_sh, long long k_ss, long long k_sd,
    long long v_sb, long long v_sh, long long v_ss, long long v_sd,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd,
    int num_splits, int write_partials, int causal, float qk_scale,
    float quant_scale, int quant_zero_point, int* __restrict__ combine_count, float* __restrict__ group_part,
    int combine_group)
{
    constexpr int NT = 32 * WM * WN;
    constexpr int BM = 16 * WM;            // rows of the block: a 16-row tile for each of WM warps
    constexpr int NR = 2;                  // rows of a lane (two of its warp's tile)
    constexpr int NKW = BN / WN;           // keys of a warp per tile
    constexpr int NST = NKW / 8;           // 8-key column tiles of a warp's S
    constexpr int KQ = DQK_B / 16;         // k steps of Q.K^T
    constexpr int NOV = DV_B / 8;          // 8-dim column tiles of O
    constexpr int CK = DQK_B / 8, CV = DV_B / 8;   // 16-byte chunks of a K / V row
    constexpr int COMBINE_CHUNK = DV_B > 128 ? 16 : 4;   // the fused combine's partials a round trip
    // Shared rows of 8, 16 or 32 chunks (head dims 64, 128, 256) are stored unpadded with chunk c
    // of row r at c ^ (r & 7): a warp's cp.async writes whole aligned rows (with padded rows it
    // split into more, partial requests: 1.4x the L2 traffic of flash's decode kernel under Nsight
    // Compute) and the 8 rows one ldmatrix reads still fall in different banks. Other head dims
    // pad each row by 16 bytes for the banks. ATTN_MMA_SWIZZLE=0 pads every row (to compare).
    constexpr bool SWK = ATTN_MMA_SWIZZLE && CK >= 8 && (CK & (CK - 1)) == 0;
    constexpr bool SWV = ATTN_MMA_SWIZZLE && CV >= 8 && (CV & (CV - 1)) == 0;
    constexpr int KS = SWK ? DQK_B : DQK_B + 8;   // shared row strides (elements)
    constexpr int VS = SWV ? DV_B : DV_B + 8;
    constexpr int KT = BN * (DQK_B + 8);          // elements reserved for the K tile (AttnMmaSmem)
    constexpr int SMEM = AttnMmaSmem<DQK_B, DV_B, BN, WM, WN>::bytes;
    constexpr bool QSM = AttnMmaSmem<DQK_B, DV_B, BN, WM, WN>::q_in_smem;
    static_assert(DQK_B % 16 == 0 && DV_B % 16 == 0 && DQK_B <= 256 && DV_B <= 256, "mma path: head dims");
    static_assert(NKW % 16 == 0 && (WN & (WN - 1)) == 0, "mma path: a warp takes a multiple of 16 keys per tile");
    static_assert(sizeof(T) == 2 && SMEM <= 99 * 1024, "mma path: 16-bit types, 99 KB of shared memory (kernels/select.py MMA_MAX_SHARED)");
    static_assert(NT % CK == 0 && NT % CV == 0 && (BN * CK) % NT == 0 && (BN * CV) % NT == 0, "mma path: tile loads");

    unsigned char* smem = attn_mma_smem;
    if (attn_dynamic_smem_size() < (unsigned)SMEM) __trap();   // the host's Variant.shared_bytes disagrees
    T* k_s = reinterpret_cast<T*>(smem);
    T* v_s = k_s + KT;
    T* q_s = v_s + BN * (DV_B + 8);     // QSM: Q's rows, laid out as K's

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int gq = lane >> 2, tq = lane & 3;    // fragment row and column pair of this lane

    const int ratio = hq / hkv;
    const int rows_per_kv = ratio * sq;
    const int groups = (rows_per_kv + BM - 1) / BM;
    const int grp = (int)(blockIdx.x % (unsigned)groups);
    const long long bk = (long long)(blockIdx.x / (unsigned)groups);   // b * hkv + kvh
    const int kvh = (int)(bk % hkv);
    const int b = (int)(bk / hkv);
    const int split = (int)blockIdx.y;
    const long long rows = (long long)g * hq * sq;

    const AttnSplitRange range = attn_split_range<BLOCK_N, true>(current_seq_len, b, sk, split, num_splits);
    const int key_begin = range.blk_begin * BLOCK_N;
    const int key_end = min(range.blk_end * BLOCK_N, range.last_key + 1);
    const long long prefix = (causal && prefix_offset) ? (long long)prefix_offset[b] : 0;
    const long long causal_shift = attn_causal_shift(prefix);   // row qi sees keys j <= qi + causal_shift

    // The rows of this lane: fragment rows gq and gq + 8 (x = 0, 1) of its warp's row tile.
    bool rvalid[NR];
    int rhead[NR], rqi[NR];
    long long rowid[NR], vis_last[NR];
#pragma unroll
    for (int x = 0; x < NR; ++x) {
        const int rr = grp * BM + wm * 16 + gq + 8 * x;
        rvalid[x] = rr < rows_per_kv;
        rhead[x] = kvh * ratio + (rvalid[x] ? rr / sq : 0);
        rqi[x] = rvalid[x] ? rr % sq : 0;
        rowid[x] = ((long long)b * hq + rhead[x]) * sq + rqi[x];
        vis_last[x] = causal ? (long long)rqi[x] + causal_shift : (long long)key_end - 1;
    }

    // Keys past the last one any row of the block sees are not walked: a causal prefill's
    // upper triangle. rocMLIR's kernel walked them; the -inf guard's defect needs that walk.
    int loop_end = key_end;
#ifndef ATTN_DEFECT_NO_NEGINF_GUARD
    if (causal) {
        const int first = grp * BM, last = min(first + BM, rows_per_kv) - 1;
        const int max_qi = (last / sq != first / sq) ? sq - 1 : last % sq;
        loop_end = (int)min((long long)key_end, max((long long)key_begin, (long long)max_qi + causal_shift + 1));
    }
#endif

    // A fragments of this warp's Q rows, for every k step (zero past dqk and for padding rows):
    // in registers, or (QSM) the block's Q rows in shared memory, in K(0)'s cp.async group.
    unsigned qf[QSM ? 1 : KQ][4];
    if constexpr (QSM) {
        for (int i = tid; i < BM * CK; i += NT) {
            const int r = i / CK, c = i % CK, rr = grp * BM + r;
            const bool ok = rr < rows_per_kv && c * 8 < dqk;
            const T* src = q + (long long)b * q_sb + (long long)(kvh * ratio + rr / sq) * q_sh
                           + (long long)(rr % sq) * q_ss + c * 8;
            attn_cp_async16(q_s + attn_smem_chunk(r, c, KS, SWK), ok ? src : q, ok);
        }
    } else {
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int r = x & 1, d = kk * 16 + tq * 2 + (x >> 1) * 8;
                const T* qp = q + (long long)b * q_sb + (long long)rhead[r] * q_sh + (long long)rqi[r] * q_ss + d;
                qf[kk][x] = (rvalid[r] && d < dqk) ? *reinterpret_cast<const unsigned*>(qp) : 0u;
            }
    }

    const T* kp = k + (long long)b * k_sb + (long long)kvh * k_sh;
    const T* vp = v + (long long)b * v_sb + (long long)kvh * v_sh;
    // Thread tid loads 16-byte chunk tid % chunks of rows tid / chunks + i * NT / chunks: one
    // pointer per tile, stepped by a row stride (per-chunk addresses would cost registers).
    auto load_tile = [&](T* dst, const T* src, long long ss, int stride, int chunks, bool swz, int dmax, int j0) {
        const int rstep = NT / chunks, key0 = tid / chunks, c = tid % chunks, d0 = c * 8;
        const bool d_ok = d0 < dmax;
        const T* sp = src + (long long)(j0 + key0) * ss + d0;
#pragma unroll
        for (int i = 0; i < BN * chunks / NT; ++i) {
            const int r = key0 + i * rstep;
            const bool ok = d_ok && j0 + r < loop_end;   // zeros past the keys: P.V reads them
            attn_cp_async16(dst + attn_smem_chunk(r, c, stride, swz), ok ? sp : src, ok);
            sp += rstep * ss;
        }
    };

    float m[NR], l[NR];             // l: this lane's share of the row sums
#pragma unroll
    for (int x = 0; x < NR; ++x) {
        m[x] = ATTN_NEG_INF;
        l[x] = 0.0f;
    }
    float acc[NOV][4];
#pragma unroll
    for (int n = 0; n < NOV; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;

    // S = Q.K^T of the warp's keys of one tile (K rows in shared memory at ks).
    auto tile_qk = [&](const T* ks, float (&s)[NST][4]) {
#pragma unroll
        for (int n = 0; n < NST; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
            unsigned qa[4];
            if constexpr (QSM)   // lanes 0-15 address rows 0-15 of chunk 2kk, lanes 16-31 of chunk 2kk+1
                attn_ldsm_x4(qa, q_s + attn_smem_chunk(wm * 16 + (lane & 15), kk * 2 + (lane >> 4), KS, SWK));
#pragma unroll
            for (int np = 0; np < NST / 2; ++np) {
                unsigned r[4];
                const int key = wn * NKW + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int c = kk * 2 + ((lane >> 3) & 1);
                attn_ldsm_x4(r, ks + attn_smem_chunk(key, c, KS, SWK));
                const unsigned (&a)[4] = QSM ? qa : qf[QSM ? 0 : kk];
                attn_mma(s[2 * np], a, r[0], r[1], T());
                attn_mma(s[2 * np + 1], a, r[2], r[3], T());
            }
        }
    };

    // Masks, scale, bias, then the online softmax of the lane's two rows; s becomes P.
    auto tile_softmax = [&](float (&s)[NST][4], int j0) {
#pragma unroll
        for (int x = 0; x < NR; ++x) {
            const int h = x;                   // the fragment row (gq or gq + 8)
            float mx = ATTN_NEG_INF;
            const int jw = j0 + wn * NKW;       // the warp's first key of this tile
#if ATTN_MMA_EXP2
            float sc = ATTN_LOG2E;     // what the exponent multiplies s by: log2 e, or scale·log2 e
#endif
            if (!bias && (!ATTN_MMA_EXP2 || qk_scale > 0.0f) && rvalid[x] && jw + NKW <= key_end && (long long)(jw + NKW - 1) <= vis_last[x]) {
                // every key visible (a prefill's tiles below the diagonal): scale only
#if ATTN_MMA_EXP2
                // s stays unscaled; max(s)·scale is max(s·scale), bit for bit, for a positive scale
#pragma unroll
                for (int n = 0; n < NST; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) mx = fmaxf(mx, s[n][2 * h + e]);
                mx *= qk_scale;
                sc = qk_scale * ATTN_LOG2E;
#else
#pragma unroll
                for (int n = 0; n < NST; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        s[n][2 * h + e] *= qk_scale;
                        mx = fmaxf(mx, s[n][2 * h + e]);
                    }
#endif
            } else {
#pragma unroll
                for (int n = 0; n < NST; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int j = jw + n * 8 + tq * 2 + e;
                        const bool vis = rvalid[x] && j < key_end && (long long)j <= vis_last[x];
                        float val = s[n][2 * h + e] * qk_scale;
                        if (vis && bias) val += attn_to_float(bias[rowid[x] * (long long)sk + j]);
                        val = vis ? val : ATTN_NEG_INF;
                        s[n][2 * h + e] = val;
                        mx = fmaxf(mx, val);
                    }
            }
            mx = fmaxf(mx, ATTN_SHFL_XOR(mx, 1));
            mx = fmaxf(mx, ATTN_SHFL_XOR(mx, 2));
            const float m_new = fmaxf(m[x], mx);
#ifdef ATTN_DEFECT_NO_NEGINF_GUARD
            const float m_use = m_new;
#else
            const float m_use = (m_new == ATTN_NEG_INF) ? 0.0f : m_new;
#endif
            // __expf (ex2.approx): prefill is bound by these; its error (~1e-5 relative here)
            // is far below P's rounding to T.
            const float alpha = __expf(m[x] - m_use);
            m[x] = m_new;
            float sum = 0.0f;
#if ATTN_MMA_EXP2
            const float mb = m_use * ATTN_LOG2E;
#endif
#pragma unroll
            for (int n = 0; n < NST; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
#if ATTN_MMA_EXP2
                    const float p = attn_ex2(fmaf(s[n][2 * h + e], sc, -mb));
#else
                    const float p = __expf(s[n][2 * h + e] - m_use);
#endif
                    s[n][2 * h + e] = p;
                    sum += p;
                }
            l[x] = l[x] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NOV; ++n) {
                acc[n][2 * h] *= alpha;
                acc[n][2 * h + 1] *= alpha;
            }
        }
    };

    // acc += P.V of the warp's keys of one tile (V rows in shared memory at vs).
    auto tile_pv = [&](const T* vs, const float (&s)[NST][4]) {
#pragma unroll
        for (int kk = 0; kk < NKW / 16; ++kk) {
            // The S accumulators of two 8-key tiles are the A fragment of one 16-key step.
            unsigned a[4];
            a[0] = attn_pack2(s[2 * kk][0], s[2 * kk][1], T());
            a[1] = attn_pack2(s[2 * kk][2], s[2 * kk][3], T());
            a[2] = attn_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], T());
            a[3] = attn_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], T());
            const int key = wn * NKW + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int np = 0; np < NOV / 2; ++np) {
                unsigned r[4];
                const int c = np * 2 + (lane >> 4);
                attn_ldsm_x4_trans(r, vs + attn_smem_chunk(key, c, VS, SWV));
                attn_mma(acc[2 * np], a, r[0], r[1], T());
                attn_mma(acc[2 * np + 1], a, r[2], r[3], T());
            }
        }
    };

    // FlashAttention 2's order: V(t) is asked for once K(t) is in, so a block has one tile in
    // flight. (Decode asking for V(t) beside K(t), two tiles in flight, is no faster:
    // docs/decisions.md, "Decode against its floor".)
    const int n_tiles = loop_end > key_begin ? (loop_end - key_begin + BN - 1) / BN : 0;
    float s[NST][4];
    if (n_tiles > 0) load_tile(k_s, kp, k_ss, KS, CK, SWK, dqk, key_begin);
    attn_cp_commit();
    for (int t = 0; t < n_tiles; ++t) {
        const int j0 = key_begin + t * BN;
        attn_cp_wait<0>();
        __syncthreads();                      // K(t) is in; every warp is past P.V(t-1)
        load_tile(v_s, vp, v_ss, VS, CV, SWV, dv, j0);
        attn_cp_commit();
        tile_qk(k_s, s);
        __syncthreads();                      // every warp is done with K(t)
        if (t + 1 < n_tiles) load_tile(k_s, kp, k_ss, KS, CK, SWK, dqk, j0 + BN);
        attn_cp_commit();
        tile_softmax(s, j0);
        attn_cp_wait<1>();
        __syncthreads();                      // V(t) is in (K(t+1) may still be on its way)
        tile_pv(v_s, s);
    }
    attn_cp_wait<0>();

#pragma unroll
    for (int x = 0; x < NR; ++x) {
        l[x] += ATTN_SHFL_XOR(l[x], 1);
        l[x] += ATTN_SHFL_XOR(l[x], 2);
    }

    // Merge the key groups' states (WN > 1): in rounds, warps wn in [h, 2h) hand theirs to wn - h.
    if constexpr (WN > 1) {
        float* ms = reinterpret_cast<float*>(smem);
        constexpr int OS = DV_B + (ATTN_MMA_MERGE_PAD ? 8 : 0);   // a row of o: 8 mod 32 banks apart
        constexpr int SLOT = 32 + 16 * OS;      // m[16], l[16], o[16][OS]
#pragma unroll
        for (int h = WN / 2; h >= 1; h /= 2) {
            __syncthreads();                  // the tiles, or the last round's slots, are free
            if (wn >= h && wn < 2 * h) {
                float* slot = ms + ((wn - h) * WM + wm) * SLOT;
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    const int r = gq + 8 * x;
                    if (tq == 0) { slot[r] = m[x]; slot[16 + r] = l[x]; }
#pragma unroll
                    for (int n = 0; n < NOV; ++n) {
                        float* at = slot + 32 + r * OS + n * 8 + tq * 2;
                        if (ATTN_MMA_MERGE_PAD) {
                            *reinterpret_cast<float2*>(at) = make_float2(acc[n][2 * x], acc[n][2 * x + 1]);
                        } else {
                            at[0] = acc[n][2 * x];
                            at[1] = acc[n][2 * x + 1];
                        }
                    }
                }
            }
            __syncthreads();
            if (wn < h) {
                const float* slot = ms + (wn * WM + wm) * SLOT;
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    const int r = gq + 8 * x;
                    const float mo = slot[r], lo = slot[16 + r];
                    const float mt = fmaxf(m[x], mo);
                    const float mu = (mt == ATTN_NEG_INF) ? 0.0f : mt;
                    const float sa = expf(m[x] - mu), sb = expf(mo - mu);
                    m[x] = mt;
                    l[x] = l[x] * sa + lo * sb;
#pragma unroll
                    for (int n = 0; n < NOV; ++n) {
                        const float* at = slot + 32 + r * OS + n * 8 + tq * 2;
                        const float2 ov = ATTN_MMA_MERGE_PAD ? *reinterpret_cast<const float2*>(at) : make_float2(at[0], at[1]);
                        acc[n][2 * x] = acc[n][2 * x] * sa + ov.x * sb;
                        acc[n][2 * x + 1] = acc[n][2 * x + 1] * sa + ov.y * sb;
                    }
                }
            }
        }
    }
    if (wn == 0) {
    #pragma unroll
        for (int x = 0; x < NR; ++x) {
            if (!rvalid[x]) continue;
            const float (&ax)[NOV][4] = acc;
            const int h = x;
    #ifdef ATTN_DEFECT_NO_ZERO_SUM_GUARD
            const bool empty = false;
    #else
            const bool empty = (l[x] == 0.0f);
    #endif
            const float inv_l = empty ? 0.0f : 1.0f / l[x];
            const float lse_val = empty ? ATTN_NEG_INF : m[x] + logf(l[x]);
            const long long row = rowid[x];
            if (write_partials) {
                float* op = o_part + ((long long)split * rows + row) * (long long)dv;
    #pragma unroll
                for (int n = 0; n < NOV; ++n)
    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int d = n * 8 + tq * 2 + e;
                        if (d < dv) op[d] = empty ? 0.0f : ax[n][2 * h + e] * inv_l;
                    }
                if (tq == 0) lse_part[(long long)split * rows + row] = lse_val;
            } else {
                T* op = o + (long long)b * o_sb + (long long)rhead[x] * o_sh + (long long)rqi[x] * o_ss;
    #pragma unroll
                for (int n = 0; n < NOV; ++n)
    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int d = n * 8 + tq * 2 + e;
                        if (d < dv) op[(long long)d * o_sd] = attn_from_float<T>(empty ? 0.0f : ax[n][2 * h + e] * inv_l);
                    }
                if (lse && tq == 0) lse[row] = lse_val;
            }
        }
    }

    // The combine, fused (decode): the last blocks to finish combine, in one or two levels.
    if (combine_count) {
        __syncthreads();                      // every thread's partials are written (thread 0 fences)
        attn_fused_combine<T, BM, NT, COMBINE_CHUNK>(smem, o_part, lse_part, o, lse, combine_count, group_part, grp * BM, rows_per_kv,
                                                      kvh * ratio, b, hq, sq, dv, rows, o_sb, o_sh, o_ss, o_sd,
                                                      num_splits, combine_group);
    }
}
#endif  // ATTN_HAVE_MMA_SM80 || ATTN_HOST_EMULATION

// ---- the combine kernel --------------------------------------------------------------------
// attn_splitkv_combine<OT, LT, NT>
//   grid = (g*Hq*Sq, ceil(dv / dims)), block = NT (a power of two, at least 64); dims, a power
//   of two dividing NT, is the host's choice (kernels/launch.py combine_dims): the value dims
//   a block sums, its NT / dims thread groups each taking every (NT/dims)-th split.
//   Weights EVERY split by exp(LSE_s - M), no validity mask (M = -FLT_MAX when all LSE_s are
//   -inf; a zero denominator stores O = 0, LSE = -inf). The weights are computed once per block
//   into shared memory. Few splits (most rows): one block sums a row's whole value vector;
//   many splits (decode of a few rows): many groups read a row's splits at once.
#ifndef ATTN_MAX_SPLITS
#define ATTN_MAX_SPLITS 1024
#endif

// Reduces x over the block: within 32-lane groups by shuffles, then across groups in t_s.
template <int NT, bool MAX>
__device__ __forceinline__ float attn_block_reduce(float x, float* t_s) {
#pragma unroll
    for (int m = 16; m > 0; m /= 2) {
        const float y = ATTN_SHFL_XOR(x, m);
        x = MAX ? fmaxf(x, y) : x + y;
    }
    if ((threadIdx.x & 31) == 0) t_s[threadIdx.x / 32] = x;
    __syncthreads();
    float r = t_s[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) r = MAX ? fmaxf(r, t_s[w]) : r + t_s[w];
    __syncthreads();
    return r;
}

template <typename OT, typename LT, int NT>
__global__ void __launch_bounds__(NT) attn_splitkv_combine(
    const float* __restrict__ o_part, const float* __restrict__ lse_part,
    OT* __restrict__ o, LT* __restrict__ lse,
    int g, int hq, int sq, int dv,
    long long o_sb, long long o_sh, long long o_ss, long long o_sd,
    int num_splits, int dims)
{
    static_assert(NT >= 64 && (NT & (NT - 1)) == 0, "NT: a power of two of at least two 32-lane groups");
    __shared__ float w_s[ATTN_MAX_SPLITS];
    __shared__ float t_s[NT / 32];
    __shared__ float red_s[NT];

    const int tid = (int)threadIdx.x;
    const long long row = (long long)blockIdx.x;
    const long long rows = (long long)g * hq * sq;
    const int qi = (int)(row % sq);
    const long long bh = row / sq;
    const int h = (int)(bh % hq);
    const int b = (int)(bh / hq);

    // Every split is weighted, valid or not: invalid and empty splits must carry LSE_s = -inf.
    // fmaxf ignores a NaN LSE_s, whose weight then makes the output NaN (a defect must show).
    float mx = -ATTN_FLT_MAX;
    for (int s = tid; s < num_splits; s += NT) mx = fmaxf(mx, lse_part[(long long)s * rows + row]);
    const float M = attn_block_reduce<NT, true>(mx, t_s);
    float part = 0.0f;
    for (int s = tid; s < num_splits; s += NT) {
#ifdef ATTN_DEFECT_COMBINE_NO_MAX_SHIFT
        const float w = expf(lse_part[(long long)s * rows + row]);
#else
        const float w = expf(lse_part[(long long)s * rows + row] - M);
#endif
        w_s[s] = w;
        part += w;
    }
    const float den = attn_block_reduce<NT, false>(part, t_s);   // its barrier orders the w_s writes
    const bool zero = (den == 0.0f);

    const int groups = NT / dims;
    const int dd = tid % dims, sg = tid / dims;
    const int d = (int)blockIdx.y * dims + dd;
    float num = 0.0f;
    if (d < dv) {
        const float* op_d = o_part + row * (long long)dv + d;
#pragma unroll 4
        for (int s = sg; s < num_splits; s += groups) num += w_s[s] * op_d[(long long)s * rows * dv];
    }
    red_s[tid] = num;
#ifndef ATTN_DEFECT_MISSING_BARRIER
    __syncthreads();
#endif
#ifdef ATTN_DEFECT_HANG
    if (row == rows - 1) {   // a volatile load every turn: no compiler may drop the loop
        const volatile float* partial = lse_part;
        const float seen = partial[0];
        while (__float_as_int(partial[0]) == __float_as_int(seen)) { }
    }
#endif
    if (sg == 0 && d < dv) {
        float tot = 0.0f;
        for (int t = 0; t < groups; ++t) tot += red_s[t * dims + dd];
        OT* op = o + (long long)b * o_sb + (long long)h * o_sh + (long long)qi * o_ss;
        op[(long long)d * o_sd] = attn_from_float<OT>(zero ? 0.0f : tot / den);
#ifdef ATTN_DEFECT_OOB_STORE
        if (row == rows - 1) op[(1LL << 40) / (long long)sizeof(OT) + (long long)d * o_sd] = attn_from_float<OT>(tot);
#endif
#ifdef ATTN_DEFECT_OOB_STORE_SMALL
        if (row == rows - 1 && d == dv - 1) o[rows * (long long)dv + 1] = attn_from_float<OT>(tot);
#endif
    }
#ifdef ATTN_DEFECT_COMBINE_NO_MAX_SHIFT
    if (lse && blockIdx.y == 0 && tid == 0) lse[row] = attn_from_float<LT>(zero ? ATTN_NEG_INF : logf(den));
#else
    if (lse && blockIdx.y == 0 && tid == 0) lse[row] = attn_from_float<LT>(zero ? ATTN_NEG_INF : M + logf(den));
#endif
}
