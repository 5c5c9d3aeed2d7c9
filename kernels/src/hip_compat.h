// hip_compat.h — the one portability header of the attention kernels.
//
// attention.hip is written in HIP. On ROCm, hiprtc compiles it as is (--offload-arch=gfxNNN)
// and this header only pulls in HIP's half/bfloat16 headers. On NVIDIA, NVRTC compiles the same
// source (-arch=sm_XX, --include-path=<CUDA include dir>) and this header maps the HIP names the
// kernels use onto CUDA's, the way HIP's own nvidia_detail headers do on that platform.
//
// Names the kernels may use: __half, __hip_bfloat16, __half2float, __float2half,
// __bfloat162float, __float2bfloat16, __int_as_float, threadIdx/blockIdx/blockDim,
// __syncthreads, __launch_bounds__, expf/logf/fmaxf/fminf, and ATTN_SHFL_XOR(x, m): x of the
// lane whose index differs in the bits of m, for m < 32 (so within a 32-lane group on NVIDIA's
// 32-lane warps and AMD's 64-lane wavefronts alike). Every lane of the block must reach it.
// ATTN_HAVE_MMA_SM80 is defined where NVIDIA's sm_80+ instructions may be used (the one
// architecture-specific path of the kernels); nothing else depends on the platform.
#ifndef ATTNSWEEP_HIP_COMPAT_H
#define ATTNSWEEP_HIP_COMPAT_H

#if defined(ATTN_HOST_EMULATION)
// ---- Host emulation (tests only): plain C++ threads stand in for one thread block. ----
#include "host_emu.h"
#define ATTN_PLATFORM_NAME "host-emulation"
#define ATTN_SHFL_XOR(x, m) attn_emu_shfl_xor((x), (m))

#elif defined(__HIPCC_RTC__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
// ---- ROCm: hiprtc pre-defines the HIP device API; only the number types need headers. ----
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_fp16.h>
// __hip_bfloat16 and its conversions come with hip/hip_bf16.h (ROCm 5.7 on). Older ROCm (HIP 5.2
// of Debian's hipcc, say) has only hip/hip_bfloat16.h: its hip_bfloat16 is the same 16 bits with
// the same round-to-nearest-even conversion, under other names, which are mapped here.
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#elif __has_include(<hip/hip_bfloat16.h>)
#include <hip/hip_bfloat16.h>
typedef hip_bfloat16 __hip_bfloat16;
__device__ __forceinline__ float __bfloat162float(hip_bfloat16 x) { return static_cast<float>(x); }
__device__ __forceinline__ hip_bfloat16 __float2bfloat16(float x) { return hip_bfloat16(x); }
#else
#error "hip_compat.h: neither hip/hip_bf16.h nor hip/hip_bfloat16.h found: the kernels need ROCm 5.2 or newer"
#endif
#define ATTN_PLATFORM_NAME "hip-amd"
#define ATTN_SHFL_XOR(x, m) __shfl_xor((x), (m))

#elif defined(__CUDACC_RTC__) || defined(__CUDACC__)
// ---- NVIDIA: the CUDA spellings of what HIP provides (hip/nvidia_detail/*). ----
#ifndef __HIP_PLATFORM_NVIDIA__
#define __HIP_PLATFORM_NVIDIA__ 1
#endif
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef __nv_bfloat16 __hip_bfloat16;  // hip/nvidia_detail/nvidia_hip_bf16.h does the same
#ifndef __HIP_DEVICE_COMPILE__
#define __HIP_DEVICE_COMPILE__ 1
#endif
#define hipThreadIdx_x threadIdx.x
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockDim_x blockDim.x
#define ATTN_PLATFORM_NAME "hip-nvidia"
#define ATTN_SHFL_XOR(x, m) __shfl_xor_sync(0xffffffffu, (x), (m))
// Tensor-core fast path (attention.hip's attn_splitkv_fwd_mma: mma.sync, ldmatrix, cp.async).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ATTN_HAVE_MMA_SM80 1
#endif

#else
#error "hip_compat.h: compile with hiprtc/hipcc (ROCm), NVRTC/nvcc (NVIDIA) or -DATTN_HOST_EMULATION"
#endif

// Constants without <cfloat>/<cmath> (neither runtime compiler ships the C library headers).
#define ATTN_NEG_INF (__int_as_float(0xff800000))
#define ATTN_FLT_MAX 3.402823466e+38f

#endif  // ATTNSWEEP_HIP_COMPAT_H
