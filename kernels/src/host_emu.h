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

// A warp shuffle through a block-wide exchange: right only where every thread of the block
// calls it the same number of times, which the kernels guarantee (see hip_compat.h).
inline float attn_emu_shfl_xor(float x, int m) {
    static float xchg[1024];
    __syncthreads();
    xchg[threadIdx.x] = x;
    __syncthreads();
    return xchg[threadIdx.x ^ (unsigned)m];
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
inline float __ldcg(const float* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Call a kernel with cuLaunchKernel-style arguments (an array of pointers to each argument).
template <typename... A, std::size_t... I>
inline void attn_emu_call(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}

template <typename... A>
inline void attn_emu_launch(void (*f)(A...), void** params, unsigned gx, unsigned gy, unsigned gz,
                            unsigned nt) {
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
