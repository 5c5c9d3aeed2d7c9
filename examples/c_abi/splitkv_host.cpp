// The split-KV decode kernel of this example on the host, behind attnsweep's C ABI
// (kernels/plugins/attnsweep_kernel.h): each query row's keys cut into split_kv splits of
// 32-key blocks, each split's partial output and LSE, then the combine. Build: see Makefile.
#include <stdio.h>

#include <vector>

#include "splitkv_core.h"

using namespace splitkv;

extern "C" const char *attnsweep_kernel_name(void) { return "c-abi-splitkv-host"; }
extern "C" const char *attnsweep_kernel_version(void) { return "1"; }
extern "C" const char *attnsweep_kernel_device(void) { return "cpu"; }

extern "C" int attnsweep_kernel_supports(const attnsweep_config *c, char *message, size_t message_len) {
    return splitkv::supports(c, message, message_len);
}

extern "C" int attnsweep_kernel_run(const attnsweep_config *c, const attnsweep_tensors *t, char *message,
                                    size_t message_len) {
    if (int status = check_call(c, message, message_len)) return status;
    const Layout at{c};
    const int group = c->num_heads_q / c->num_heads_kv, S = c->split_kv, Dv = c->head_dim_v;
    std::vector<float> o_part((size_t)S * Dv), lse_part(S), acc(Dv);
    for (int b = 0; b < c->g; ++b)
        for (int h = 0; h < c->num_heads_q; ++h)
            for (int s = 0; s < c->seq_len_q; ++s) {
                const int hk = h / group, limit = row_limit(c, b, s);
                for (int split = 0; split < S; ++split) {
                    int begin, end;
                    split_keys(c, b, split, &begin, &end);
                    float m = -INFINITY, l = 0.f;
                    for (int d = 0; d < Dv; ++d) acc[d] = 0.f;
                    for (int j = begin; j < end && j <= limit; ++j) {
                        float logit = 0.f;
                        for (int d = 0; d < c->head_dim_qk; ++d)
                            logit += load(t->q, at.q(b, h, s, d), c->dtype) * load(t->k, at.k(b, hk, j, d), c->dtype);
                        logit *= c->softmax_scale;
                        if (c->with_attn_bias) logit += load(t->bias, at.bias(b, h, s, j), c->dtype);
                        float m_new = fmaxf(m, logit);
                        float keep = m == -INFINITY ? 0.f : expf(m - m_new), w = expf(logit - m_new);
                        l = l * keep + w;
                        for (int d = 0; d < Dv; ++d) acc[d] = acc[d] * keep + w * load(t->v, at.v(b, hk, j, d), c->dtype);
                        m = m_new;
                    }
                    for (int d = 0; d < Dv; ++d) o_part[(size_t)split * Dv + d] = l > 0.f ? acc[d] / l : 0.f;
                    lse_part[split] = l > 0.f ? m + logf(l) : -INFINITY;
                }
                const float M = combine_max(lse_part.data(), S, 1);
                float total = 0.f;
                for (int split = 0; split < S; ++split) total += expf(lse_part[split] - M);
                for (int d = 0; d < Dv; ++d) {
                    float sum = 0.f;
                    for (int split = 0; split < S; ++split) sum += expf(lse_part[split] - M) * o_part[(size_t)split * Dv + d];
                    store(t->out, at.o(b, h, s, d), c->dtype, total > 0.f ? sum / total : 0.f);
                }
                if (c->return_lse) {
                    int64_t i = ((int64_t)b * c->num_heads_q + h) * c->seq_len_q + s;
                    ((float *)t->lse)[i] = total > 0.f ? M + logf(total) : -INFINITY;
                }
            }
    return ATTNSWEEP_OK;
}
