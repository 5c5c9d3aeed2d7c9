// host_emu.h — runs attention.hip's kernels as plain C++ on the host, for tests without a GPU.
//
// Included by hip_compat.h when ATTN_HOST_EMULATION is defined (g++ -std=c++20 -pthread).
// One thread block at a time: NT std::threads walk every block of the grid in the same order,
// `__shared__` becomes a function-static (shared by the NT threads) and __syncthreads a
// std::barrier. Slow, but it executes the very source the GPUs compile, so the unit tests can
// check the kernels' arithmetic, guards and defect switches on any machine with a C++ compiler.
// Not part of the GPU compile (not in the source hash).
#ifndef ATTNSWEEP_HOST_EMU_H
#define ATTNSWEEP_HOST_EMU_H

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

using std::max;
using std::min;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static

struct attn_emu_dim3 { unsigned x, y, z; };
inline thread_local attn_emu_dim3 threadIdx{0, 0, 0};
inline thread_local attn_emu_dim3 blockIdx{0, 0, 0};
inline attn_emu_dim3 blockDim{1, 1, 1};
inline attn_emu_dim3 gridDim{1, 1, 1};
inline std::barrier<>* attn_emu_barrier = nullptr;

inline void __syncthreads() { attn_emu_barrier->arrive_and_wait(); }

// Which of two copies of an exchange array this thread's call of an operation uses. Every thread
// writes copy n % 2 in its n-th call after passing the barrier of its call n - 1, which no thread
// passes before every thread has read copy n % 2 in call n - 2: one barrier a call (between the
// writes and the reads) suffices, not a second one before the writes.
template <typename Op>
inline unsigned attn_emu_copy() {
    thread_local unsigned calls = 0;   // threads are made afresh for every launch
    return calls++ & 1u;
}

// A warp shuffle through a block-wide exchange: right only where every thread of the block
// calls it the same number of times, which the kernels guarantee (see hip_compat.h).
struct AttnEmuShfl;
inline float attn_emu_shfl_xor(float x, int m) {
    static float xchg[2][1024];
    float* copy = xchg[attn_emu_copy<AttnEmuShfl>()];
    copy[threadIdx.x] = x;
    __syncthreads();
    return copy[threadIdx.x ^ (unsigned)m];
}

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }

struct __half { std::uint16_t bits; };
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
inline __half __float2half(float x) { _Float16 f = (_Float16)x; __half h; std::memcpy(&h.bits, &f, 2); return h; }

struct __hip_bfloat16 { std::uint16_t bits; };
inline float __bfloat162float(__hip_bfloat16 b) { return __int_as_float((int)((std::uint32_t)b.bits << 16)); }
inline __hip_bfloat16 __float2bfloat16(float x) {
    std::uint32_t u = (std::uint32_t)__float_as_int(x);
    __hip_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) { b.bits = 0x7fc0; return b; }  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                         // round to nearest even
    b.bits = (std::uint16_t)(u >> 16);
    return b;
}

// What the fused combine (attn_fused_combine) uses. Blocks run one after another here, so its
// counters need no more than an atomic add, its fences nothing, and its L2 loads are plain loads.
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct float2 { float x, y; };   // and the mma kernel's merge of its key groups
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float __ldcg(const float* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- What the tensor-core kernel (attn_splitkv_fwd_mma) uses: NVIDIA's warp-wide instructions,
// each lane's registers laid out as the PTX ISA specifies ("Matrix fragments for mma.m16n8k16",
// "ldmatrix"), exchanged through block-wide arrays as the shuffle above is (every thread of the
// block reaches them equally often). The products are summed in f32 in k order, where the tensor
// cores' order and internal precision are unspecified: results may differ from a GPU's in the last
// bits, never in which keys, rows and splits count.
inline float __expf(float x) { return std::exp(x); }
inline float attn_ex2(float x) { return std::exp2(x); }
[[noreturn]] inline void __trap() { std::abort(); }

// Dynamic shared memory (extern __shared__ on a GPU): one buffer, blocks run one at a time; its
// size is what the launch asked for (attn_emu_launch's `shared`), which the kernel checks.
alignas(16) inline unsigned char attn_mma_smem[232448];   // sm_90's opt-in maximum per block
inline unsigned attn_emu_dynamic_smem = 0;
inline unsigned attn_dynamic_smem_size() { return attn_emu_dynamic_smem; }

// cp.async completes at once here; the kernel's barriers already order every use of its data.
inline void attn_cp_async16(void* dst, const void* src, bool valid) {
    if (valid) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
}
inline void attn_cp_commit() {}
template <int N> inline void attn_cp_wait() {}

inline std::uint16_t attn_emu_bits(__half h) { return h.bits; }
inline std::uint16_t attn_emu_bits(__hip_bfloat16 b) { return b.bits; }
inline float attn_emu_widen(std::uint16_t bits, __half) { __half h{bits}; return __half2float(h); }
inline float attn_emu_widen(std::uint16_t bits, __hip_bfloat16) { __hip_bfloat16 b{bits}; return __bfloat162float(b); }

// Two floats rounded to T, the first in the low half (the lower column of a fragment).
inline unsigned attn_pack2(float a, float b, __half) {
    return attn_emu_bits(__float2half(a)) | (unsigned)attn_emu_bits(__float2half(b)) << 16;
}
inline unsigned attn_pack2(float a, float b, __hip_bfloat16) {
    return attn_emu_bits(__float2bfloat16(a)) | (unsigned)attn_emu_bits(__float2bfloat16(b)) << 16;
}

// ldmatrix.m8n8.x4(.trans): lanes 8i..8i+7 address the rows of matrix i; lane l receives, in
// register i, the elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of matrix i, or with .trans
// (2(l%4), l/4) and (2(l%4)+1, l/4).
struct AttnEmuLdsm;
inline void attn_emu_ldsm(unsigned (&r)[4], const void* p, bool trans) {
    static const void* copies[2][1024];
    const void** rows = copies[attn_emu_copy<AttnEmuLdsm>()];
    rows[threadIdx.x] = p;
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, warp0 = threadIdx.x - lane;
    for (unsigned i = 0; i < 4; ++i) {
        unsigned v = 0;
        for (unsigned e = 0; e < 2; ++e) {
            const unsigned row = trans ? 2 * (lane % 4) + e : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + e;
            std::uint16_t x;
            std::memcpy(&x, static_cast<const unsigned char*>(rows[warp0 + 8 * i + row]) + 2 * col, 2);
            v |= (unsigned)x << (16 * e);
        }
        r[i] = v;
    }
}
inline void attn_ldsm_x4(unsigned (&r)[4], const void* p) { attn_emu_ldsm(r, p, false); }
inline void attn_ldsm_x4_trans(unsigned (&r)[4], const void* p) { attn_emu_ldsm(r, p, true); }

// mma.m16n8k16.row.col, f32 accumulators: c += A.B with lane l = 4g + t (g = l/4, t = l%4) holding
// A's (g, 2t..2t+1) in a[0], (g+8, 2t..) in a[1], (g, 2t+8..) in a[2], (g+8, 2t+8..) in a[3];
// B's (k = 2t..2t+1, n = g) in b0 and (k = 2t+8.., n = g) in b1; C's (g, 2t..2t+1) in c[0..1] and
// (g+8, 2t..2t+1) in c[2..3]. The low half of a register is the lower column (or k).
struct AttnEmuMma;
template <typename T>
inline void attn_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, T) {
    static unsigned xa2[2][1024][4], xb2[2][1024][2];
    const unsigned copy = attn_emu_copy<AttnEmuMma>();
    unsigned (*xa)[4] = xa2[copy];
    unsigned (*xb)[2] = xb2[copy];
    for (int i = 0; i < 4; ++i) xa[threadIdx.x][i] = a[i];
    xb[threadIdx.x][0] = b0;
    xb[threadIdx.x][1] = b1;
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, warp0 = threadIdx.x - lane;
    auto half = [](unsigned reg, unsigned k) { return (std::uint16_t)(reg >> (16 * (k & 1))); };
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
        float sum = 0.0f;
        for (unsigned k = 0; k < 16; ++k) {
            const unsigned a_reg = xa[warp0 + (row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];
            const unsigned b_reg = xb[warp0 + col * 4 + (k % 8) / 2][k / 8];
            sum += attn_emu_widen(half(a_reg, k), T()) * attn_emu_widen(half(b_reg, k), T());
        }
        c[i] += sum;
    }
}

// Call a kernel with cuLaunchKernel-style arguments (an array of pointers to each argument).
template <typename... A, std::size_t... I>
inline void attn_emu_call(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}

template <typename... A>
inline void attn_emu_launch(void (*f)(A...), void** params, unsigned gx, unsigned gy, unsigned gz,
                            unsigned nt, unsigned shared = 0) {
    if (shared > sizeof(attn_mma_smem)) std::abort();
    attn_emu_dynamic_smem = shared;
    std::barrier<> bar((std::ptrdiff_t)nt);
    attn_emu_barrier = &bar;
    blockDim = {nt, 1, 1};
    gridDim = {gx, gy, gz};
    std::vector<std::thread> threads;
    threads.reserve(nt);
    for (unsigned t = 0; t < nt; ++t) {
        threads.emplace_back([=, &bar] {
            threadIdx = {t, 0, 0};
            for (unsigned z = 0; z < gz; ++z)
                for (unsigned y = 0; y < gy; ++y)
                    for (unsigned x = 0; x < gx; ++x) {
                        blockIdx = {x, y, z};
                        attn_emu_call(f, params, std::index_sequence_for<A...>{});
                        bar.arrive_and_wait();  // the next block reuses the shared arrays
                    }
        });
    }
    for (auto& th : threads) th.join();
    attn_emu_barrier = nullptr;
}

#endif  // ATTNSWEEP_HOST_EMU_H
