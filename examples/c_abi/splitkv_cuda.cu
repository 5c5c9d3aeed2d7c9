// The example's split-KV decode kernel on a CUDA GPU, behind attnsweep's C ABI: one warp per
// (query row, split) computes the split's partial (the lanes share the head dims; a warp
// shuffle sums each Q·K), a second kernel combines the splits. Same arithmetic as the host
// build (splitkv_core.h). Build: `make cuda` (nvcc).
#include <cuda_runtime.h>
#include <stdio.h>

#include "splitkv_core.h"

using namespace splitkv;

constexpr int WARPS = 4;                              // warps per block
constexpr int PER_LANE = MAX_HEAD_DIM / 32;           // head dims a lane holds

extern "C" const char *attnsweep_kernel_name(void) { return "c-abi-splitkv-cuda"; }
extern "C" const char *attnsweep_kernel_version(void) { return "1"; }
extern "C" const char *attnsweep_kernel_device(void) { return "cuda"; }

extern "C" int attnsweep_kernel_supports(const attnsweep_config *c, char *message, size_t message_len) {
    return splitkv::supports(c, message, message_len);
}

// The config with its per-batch arrays in device memory.
struct DeviceConfig {
    attnsweep_config c;
};

__global__ void partials(DeviceConfig dc, attnsweep_tensors t, float *o_part, float *lse_part, int64_t rows) {
    const attnsweep_config *c = &dc.c;
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (item >= rows * c->split_kv) return;
    const int split = (int)(item % c->split_kv);
    const int64_t row = item / c->split_kv;
    const int s = (int)(row % c->seq_len_q), h = (int)((row / c->seq_len_q) % c->num_heads_q);
    const int b = (int)(row / ((int64_t)c->seq_len_q * c->num_heads_q));
    const int hk = h / (c->num_heads_q / c->num_heads_kv), Dv = c->head_dim_v;
    const Layout at{c};
    int begin, end;
    split_keys(c, b, split, &begin, &end);
    const int limit = row_limit(c, b, s);
    float acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int j = begin; j < end && j <= limit; ++j) {
        float part = 0.f;
        for (int d = lane; d < c->head_dim_qk; d += 32)
            part += load(t.q, at.q(b, h, s, d), c->dtype) * load(t.k, at.k(b, hk, j, d), c->dtype);
        for (int off = 16; off; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        float logit = part * c->softmax_scale;
        if (c->with_attn_bias) logit += load(t.bias, at.bias(b, h, s, j), c->dtype);
        const float m_new = fmaxf(m, logit);
        const float keep = m == -INFINITY ? 0.f : __expf(m - m_new), w = __expf(logit - m_new);
        l = l * keep + w;
        for (int i = 0, d = lane; d < Dv; ++i, d += 32) acc[i] = acc[i] * keep + w * load(t.v, at.v(b, hk, j, d), c->dtype);
        m = m_new;
    }
    const int64_t slot = (int64_t)split * rows + row;
    for (int i = 0, d = lane; d < Dv; ++i, d += 32) o_part[slot * Dv + d] = l > 0.f ? acc[i] / l : 0.f;
    if (lane == 0) lse_part[slot] = l > 0.f ? m + logf(l) : -INFINITY;
}

__global__ void combine(DeviceConfig dc, attnsweep_tensors t, const float *o_part, const float *lse_part, int64_t rows) {
    const attnsweep_config *c = &dc.c;
    const int64_t row = blockIdx.x;
    const int S = c->split_kv, Dv = c->head_dim_v;
    const int s = (int)(row % c->seq_len_q), h = (int)((row / c->seq_len_q) % c->num_heads_q);
    const int b = (int)(row / ((int64_t)c->seq_len_q * c->num_heads_q));
    const float M = combine_max(lse_part + row, S, rows);
    float total = 0.f;
    for (int split = 0; split < S; ++split) total += expf(lse_part[split * rows + row] - M);
    const Layout at{c};
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float sum = 0.f;
        for (int split = 0; split < S; ++split)
            sum += expf(lse_part[split * rows + row] - M) * o_part[((int64_t)split * rows + row) * Dv + d];
        store(t.out, at.o(b, h, s, d), c->dtype, total > 0.f ? sum / total : 0.f);
    }
    if (threadIdx.x == 0 && c->return_lse) ((float *)t.lse)[row] = total > 0.f ? M + logf(total) : -INFINITY;
}

static int fail(cudaError_t err, const char *what, char *message, size_t message_len) {
    snprintf(message, message_len, "%s: %s", what, cudaGetErrorString(err));
    return ATTNSWEEP_ERROR;
}

extern "C" int attnsweep_kernel_run(const attnsweep_config *config, const attnsweep_tensors *t, char *message,
                                    size_t message_len) {
    if (int status = check_call(config, message, message_len)) return status;
    cudaStream_t stream = (cudaStream_t)t->stream;
    DeviceConfig dc{*config};
    const int g = config->g;
    const int64_t rows = (int64_t)g * config->num_heads_q * config->seq_len_q, S = config->split_kv;
    int32_t *per_batch = nullptr;   // prefix_offset then current_seq_len, copied to the device
    float *o_part = nullptr, *lse_part = nullptr;
    cudaError_t err = cudaMalloc(&per_batch, 2 * sizeof(int32_t) * g);
    if (!err) err = cudaMalloc(&o_part, sizeof(float) * S * rows * config->head_dim_v);
    if (!err) err = cudaMalloc(&lse_part, sizeof(float) * S * rows);
    if (!err && config->prefix_offset) {
        err = cudaMemcpyAsync(per_batch, config->prefix_offset, sizeof(int32_t) * g, cudaMemcpyHostToDevice, stream);
        dc.c.prefix_offset = per_batch;
    }
    if (!err && config->current_seq_len) {
        err = cudaMemcpyAsync(per_batch + g, config->current_seq_len, sizeof(int32_t) * g, cudaMemcpyHostToDevice, stream);
        dc.c.current_seq_len = per_batch + g;
    }
    if (!err) {
        const int64_t items = rows * S;
        partials<<<(unsigned)((items + WARPS - 1) / WARPS), 32 * WARPS, 0, stream>>>(dc, *t, o_part, lse_part, rows);
        err = cudaGetLastError();
    }
    if (!err) {
        combine<<<(unsigned)rows, 128, 0, stream>>>(dc, *t, o_part, lse_part, rows);
        err = cudaGetLastError();
    }
    if (!err) err = cudaStreamSynchronize(stream);
    const char *what = "the split-KV kernels";
    cudaFree(per_batch);
    cudaFree(o_part);
    cudaFree(lse_part);
    return err ? fail(err, what, message, message_len) : ATTNSWEEP_OK;
}
