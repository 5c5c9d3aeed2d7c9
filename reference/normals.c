/* numpy's standard normal draws on PCG64 (Generator.standard_normal), bit for bit, rounded once
 * to a storage type: the compiled loop of reference/normals.py, which says why and when it runs.
 *
 * The stream is PCG64 (128-bit LCG, XSL-RR output, pcg-random.org's constants), stepped here in
 * registers. Each value takes the ziggurat's fast path here: the low 8 bits of a raw draw pick a
 * layer, bit 8 the sign, bits 9..60 an integer that times the layer's width is the value, kept
 * when the integer is below the layer's bound. Any draw off the fast path (about 1 in 100: the
 * wedges and the tail, which draw more uniforms) is made by numpy's own random_standard_normal
 * (its C API, libnpyrandom.a) on the same state, so no copy of that code lives here. The widths
 * and bounds are not copied either: attn_normals_init reads them out of that same function by
 * feeding it chosen raw draws. reference/normals.py checks the whole at load against numpy's
 * Generator and does not use it unless every bit agrees.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "numpy/random/bitgen.h"

extern double random_standard_normal(bitgen_t *bitgen_state);

typedef __uint128_t u128;
#define PCG_MULT (((u128)0x2360ED051FC65DA4ULL << 64) | (u128)0x4385DF649FCCF645ULL)

typedef struct {
    u128 state;
    u128 inc;
} pcg_t;

static inline u128 pcg_step(u128 s, u128 inc) { return s * PCG_MULT + inc; }

static inline uint64_t pcg_output(u128 s) {
    uint64_t hi = (uint64_t)(s >> 64), x = hi ^ (uint64_t)s;
    unsigned rot = (unsigned)(hi >> 58);
    return (x >> rot) | (x << ((-rot) & 63u));
}

static uint64_t pcg_next64(void *st) {
    pcg_t *p = (pcg_t *)st;
    p->state = pcg_step(p->state, p->inc);
    return pcg_output(p->state);
}

/* Only next_uint64 and next_double reach a normal draw; the 32-bit one is there to fill the
 * struct (it never runs: numpy's PCG64 would buffer the other half, which this one cannot). */
static uint32_t pcg_next32(void *st) { return (uint32_t)pcg_next64(st); }

static double pcg_next_double(void *st) { return (double)(pcg_next64(st) >> 11) * (1.0 / 9007199254740992.0); }

/* The fast path: layer widths (x = k * width) and bounds (kept when k < bound). */
static double width[256];
static uint64_t bound[256];
static int ready;

/* Raw draws served from a list, to ask numpy's function what it makes of them. */
typedef struct {
    const uint64_t *raw;
    int pos;
} feed_t;

static uint64_t feed_next64(void *st) {
    feed_t *f = (feed_t *)st;
    return f->raw[f->pos++];
}
static uint32_t feed_next32(void *st) { return (uint32_t)feed_next64(st); }
static double feed_next_double(void *st) { return (double)(feed_next64(st) >> 11) * (1.0 / 9007199254740992.0); }

/* numpy's value for a first raw draw `raw` (later draws: fixed uniforms), and how many draws it took. */
static int numpy_draw(uint64_t raw, double *value) {
    uint64_t feed[64];
    feed[0] = raw;
    for (int i = 1; i < 64; i++)
        feed[i] = 0x9E3779B97F4A7C15ULL * (uint64_t)i;
    feed_t f = {feed, 0};
    bitgen_t bg = {&f, feed_next64, feed_next32, feed_next_double, feed_next64};
    *value = random_standard_normal(&bg);
    return f.pos;
}

static inline uint64_t raw_of(int layer, uint64_t k) { return (uint64_t)layer | (k << 9); }

/* 0 when the tables were read; -1 when numpy's function does not behave as the fast path
 * assumes (then normals.py does not use this loop). */
int attn_normals_init(void) {
    for (int layer = 0; layer < 256; layer++) {
        double v;
        /* k = 1 gives the width itself, from the fast path or from a wedge test it passes. */
        numpy_draw(raw_of(layer, 1), &v);
        width[layer] = v;
        if (!(v > 0.0))
            return -1;
        if (numpy_draw(raw_of(layer, 0), &v) != 1) {
            bound[layer] = 0; /* no fast path in this layer */
            continue;
        }
        uint64_t lo = 0, hi = (uint64_t)1 << 52; /* kept at lo, not at hi */
        if (numpy_draw(raw_of(layer, hi - 1), &v) == 1) {
            bound[layer] = hi;
            continue;
        }
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (numpy_draw(raw_of(layer, mid), &v) == 1)
                lo = mid;
            else
                hi = mid;
        }
        bound[layer] = hi;
    }
    ready = 1;
    return 0;
}

/* float64 -> bfloat16 / float16 bits, one round-to-nearest-even, for a finite x (normal draws are). */
static inline uint16_t narrow_bits(double x, int mant, int bias, int min_exp, uint64_t inf) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    uint64_t sign = (b >> 63) << 15, a = b & 0x7FFFFFFFFFFFFFFFULL;
    int drop = 52 - mant;
    if ((int64_t)(a >> 52) >= 1023 + min_exp) {
        /* Normal in the narrow type: round the mantissa at its last bit (a carry moves the
         * exponent up, to inf past the largest value), then move the exponent's bias. */
        uint64_t r = (a + ((a >> drop) & 1u) + (((uint64_t)1 << (drop - 1)) - 1u)) >> drop;
        int64_t h = (int64_t)r - ((int64_t)(1023 - bias) << mant);
        return (uint16_t)(sign | (uint64_t)(h >= (int64_t)inf ? (int64_t)inf : h));
    }
    /* Subnormal (or zero) in the narrow type: a multiple of its smallest spacing; the scaling
     * by a power of two is exact, rint rounds to nearest even (the default rounding mode). */
    double k = rint(fabs(x) * ldexp(1.0, mant - min_exp));
    return (uint16_t)(sign | (uint64_t)k);
}

static inline void store(void *out, int64_t i, double x, int kind) {
    switch (kind) {
    case 0: ((double *)out)[i] = x; break;
    case 1: ((float *)out)[i] = (float)x; break;
    case 2: ((uint16_t *)out)[i] = narrow_bits(x, 10, 15, -14, 0x7C00); break;
    default: ((uint16_t *)out)[i] = narrow_bits(x, 7, 127, -126, 0x7F80); break;
    }
}

/* x rounded once to `kind` (0 float64, 1 float32, 2 float16 bits, 3 bfloat16 bits) into out;
 * 1, and nothing written, when x holds a NaN or an infinity (the caller casts those itself). */
int attn_narrow(const double *x, int64_t n, void *out, int kind) {
    if (kind < 0 || kind > 3)
        return -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 1;
    for (int64_t i = 0; i < n; i++) /* the switch inside: one branch the predictor always gets right */
        store(out, i, x[i], kind);
    return 0;
}

/* The next n normals of the PCG64 state {state hi, state lo, inc hi, inc lo} (updated), each
 * rounded once to `kind`. */
static inline void draw(uint64_t *st, int64_t n, void *out, int kind) {
    u128 s = ((u128)st[0] << 64) | st[1];
    const u128 inc = ((u128)st[2] << 64) | st[3];
    pcg_t slow = {0, inc};
    bitgen_t bg = {&slow, pcg_next64, pcg_next32, pcg_next_double, pcg_next64};
    for (int64_t i = 0; i < n; i++) {
        u128 next = pcg_step(s, inc);
        uint64_t r = pcg_output(next);
        int layer = (int)(r & 0xFF);
        r >>= 8;
        int64_t k = (int64_t)((r >> 1) & 0x000FFFFFFFFFFFFFULL);
        double x = (double)k * width[layer];
        /* The sign as a bit, not a branch: a coin flip mispredicts half the time. */
        uint64_t xb;
        memcpy(&xb, &x, sizeof xb);
        xb ^= (r & 1u) << 63;
        memcpy(&x, &xb, sizeof x);
        if (__builtin_expect((uint64_t)k < bound[layer], 1)) {
            s = next;
        } else {
            slow.state = s; /* numpy draws this value, from the same raw draw on */
            x = random_standard_normal(&bg);
            s = slow.state;
        }
        store(out, i, x, kind);
    }
    st[0] = (uint64_t)(s >> 64);
    st[1] = (uint64_t)s;
}

int attn_normals(uint64_t *st, int64_t n, void *out, int kind) {
    if (!ready || kind < 0 || kind > 3)
        return -1;
    switch (kind) {
    case 0: draw(st, n, out, 0); break;
    case 1: draw(st, n, out, 1); break;
    case 2: draw(st, n, out, 2); break;
    default: draw(st, n, out, 3); break;
    }
    return 0;
}
