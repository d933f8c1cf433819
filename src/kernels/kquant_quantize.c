/*
 * kquant_quantize.c: float rows to the K-quant formats (Q2_K .. Q6_K), for the tools that write
 * GGUF files. The search for each sub-block's scale (and min) is the one llama.cpp's reference
 * quantizers run without an importance matrix (ggml-quants.c, quantize_row_q*_K_ref), in the same
 * float order, so a row quantized here has the bytes llama-quantize writes for it.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

/* Below this a group of weights is all zero. */
#define GROUP_EPS 1e-15f

/* Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the mantissa: exact for
 * |f| < 2^22, and for larger values (or NaN) some int in [-2^22, 2^22) that the callers clamp,
 * the same one llama.cpp's nearest_int gives, so even degenerate rows quantize alike. */
static int nearest(float f) {
    const float v = f + 12582912.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (int)(u & 0x007fffffu) - 0x00400000;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void put_fp16(uint16_t *dst, float f) {
    const uint16_t h = st_f32_to_fp16(f);
    memcpy(dst, &h, 2);
}

static float get_fp16(const uint16_t *src) {
    uint16_t h;
    memcpy(&h, src, 2);
    return st_fp16_to_f32(h);
}

/* Symmetric quants in [-nmax, nmax - 1] for n values, weighted by x^2: start from the scale that
 * maps the value of largest magnitude to -nmax, then try 18 nearby scales and keep the one of
 * least weighted squared error, refitting the scale by least squares (Q6_K's sub-blocks).
 * L gets q + nmax; returns the scale. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(clampi(nearest(iscale * x[i]), -nmax, nmax - 1) + nmax);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's sub-block fit: symmetric quants in [-nmax, nmax - 1] from the max-magnitude scale, then
 * up to five passes that move single quants while the x^2-weighted fit improves. L gets
 * q + nmax; returns the least-squares scale. */
static float fit_symmetric_iter(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0.0f))
                continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            const int nl = clampi(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == L[i])
                continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric quants in [0, nmax] with x ~ scale * q - m (m >= 0) for n values under weights w:
 * start from the range [min(x, 0), max x], then try nstep + 1 scales (rmin + rdelta * is + nmax
 * steps over the range), refitting scale and min by weighted least squares, and keep the least
 * error (absolute if use_mad, else squared). Returns the scale; *the_min gets m. */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                        uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0.0f)
        min = 0.0f;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.0f / iscale;
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0.0f))
            continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * (float)Laux[i] + this_min - x[i];
            diff = use_mad ? fabsf(diff) : diff * diff;
            err += w[i] * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Packs 256 two-bit quants: element 128h + 32s + l into bits 2s of qs[32h + l]. */
static void pack_2bit(uint8_t qs[64], const uint8_t *L) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *p = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(p[0] | p[32] << 2 | p[64] << 4 | p[96] << 6);
        }
}

/* Q4_K / Q5_K: the packed six-bit scale and min of each of the 8 sub-blocks. */
static void pack_scales_k4(uint8_t s[12], const uint8_t ls[8], const uint8_t lm[8]) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((ls[j + 4] & 0xf) | (lm[j + 4] & 0xf) << 4);
    }
}

void st_quantize_row_q2_k(const float *x, void *dst, int64_t k) {
    st_block_q2_k *y = dst;
    for (int64_t b = 0; b < k / ST_QK_K; b++, x += ST_QK_K) {
        uint8_t L[ST_QK_K], Laux[16];
        float w[16], scales[16], mins[16];
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++)
                w[l] = fabsf(x[16 * j + l]);
            scales[j] =
                fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
        memset(y[b].scales, 0, sizeof y[b].scales);
        put_fp16(&y[b].d, max_scale > 0.0f ? max_scale / 15.0f : 0.0f);
        put_fp16(&y[b].dmin, max_min > 0.0f ? max_min / 15.0f : 0.0f);
        if (max_scale > 0.0f) {
            const float is = 15.0f / max_scale;
            for (int j = 0; j < 16; j++)
                y[b].scales[j] = (uint8_t)nearest(is * scales[j]);
        }
        if (max_min > 0.0f) {
            const float is = 15.0f / max_min;
            for (int j = 0; j < 16; j++)
                y[b].scales[j] = (uint8_t)(y[b].scales[j] | nearest(is * mins[j]) << 4);
        }
        const float d = get_fp16(&y[b].d), dmin = get_fp16(&y[b].dmin);
        for (int j = 0; j < 16; j++) {
            const float dj = d * (float)(y[b].scales[j] & 0xf);
            if (dj == 0.0f)
                continue;
            const float mj = dmin * (float)(y[b].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clampi(nearest((x[16 * j + l] + mj) / dj), 0, 3);
        }
        pack_2bit(y[b].qs, L);
    }
}

void st_quantize_row_q3_k(const float *x, void *dst, int64_t k) {
    st_block_q3_k *y = dst;
    for (int64_t b = 0; b < k / ST_QK_K; b++, x += ST_QK_K) {
        int8_t L[ST_QK_K];
        float scales[16];
        float amax = 0.0f, max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric_iter(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(y[b].scales, 0, sizeof y[b].scales);
        if (max_scale != 0.0f) {
            const float is = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = clampi((int8_t)nearest(is * scales[j]), -32, 31) + 32;
                if (j < 8)
                    y[b].scales[j] = (uint8_t)(l & 0xf);
                else
                    y[b].scales[j - 8] = (uint8_t)(y[b].scales[j - 8] | (l & 0xf) << 4);
                y[b].scales[8 + j % 4] =
                    (uint8_t)(y[b].scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
            }
            put_fp16(&y[b].d, 1.0f / is);
        } else {
            put_fp16(&y[b].d, 0.0f);
        }
        const float d = get_fp16(&y[b].d);
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? y[b].scales[j] & 0xf : y[b].scales[j - 8] >> 4;
            const int hi = (y[b].scales[8 + j % 4] >> (2 * (j / 4))) & 3;
            const float dj = d * (float)((lo | hi << 4) - 32);
            if (dj == 0.0f)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(nearest(x[16 * j + l] / dj), -4, 3) + 4);
        }
        /* high bit of element 32i + l in bit i of hmask[l]; the low two bits as Q2_K */
        uint8_t lo2[ST_QK_K];
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int e = 0; e < ST_QK_K; e++) {
            if (L[e] > 3)
                y[b].hmask[e % 32] = (uint8_t)(y[b].hmask[e % 32] | 1u << (e / 32));
            lo2[e] = (uint8_t)(L[e] & 3);
        }
        pack_2bit(y[b].qs, lo2);
    }
}

/* Q4_K and Q5_K share the fit: 8 sub-blocks of 32, affine, weighted by rms + |x|, six-bit
 * scales and mins against two fp16 super-scales; L gets the quants in [0, nmax]. */
static void quantize_k45(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out,
                         uint16_t *dmin_out, uint8_t s[12], uint8_t L[ST_QK_K]) {
    uint8_t Laux[32], ls[8], lm[8];
    float w[32], scales[8], mins[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] =
            fit_affine(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        const uint8_t a = (uint8_t)nearest(inv_scale * scales[j]);
        const uint8_t m = (uint8_t)nearest(inv_min * mins[j]);
        ls[j] = a < 63 ? a : 63;
        lm[j] = m < 63 ? m : 63;
    }
    pack_scales_k4(s, ls, lm);
    put_fp16(d_out, max_scale / 63.0f);
    put_fp16(dmin_out, max_min / 63.0f);
    const float d = get_fp16(d_out), dmin = get_fp16(dmin_out);
    for (int j = 0; j < 8; j++) {
        const float dj = d * (float)ls[j];
        if (dj == 0.0f)
            continue;
        const float mj = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(nearest((x[32 * j + l] + mj) / dj), 0, nmax);
    }
}

void st_quantize_row_q4_k(const float *x, void *dst, int64_t k) {
    st_block_q4_k *y = dst;
    for (int64_t b = 0; b < k / ST_QK_K; b++, x += ST_QK_K) {
        uint8_t L[ST_QK_K];
        quantize_k45(x, 15, -1.0f, 20, &y[b].d, &y[b].dmin, y[b].scales, L);
        /* element 64c + l: low nibble of qs[32c + l]; 64c + 32 + l: high nibble */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
}

void st_quantize_row_q5_k(const float *x, void *dst, int64_t k) {
    st_block_q5_k *y = dst;
    for (int64_t b = 0; b < k / ST_QK_K; b++, x += ST_QK_K) {
        uint8_t L[ST_QK_K];
        quantize_k45(x, 31, -0.5f, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int e = 0; e < ST_QK_K; e++)
            if (L[e] > 15)
                y[b].qh[e % 32] = (uint8_t)(y[b].qh[e % 32] | 1u << (e / 32));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * c + l] =
                    (uint8_t)((L[64 * c + l] & 0xf) | (L[64 * c + 32 + l] & 0xf) << 4);
    }
}

void st_quantize_row_q6_k(const float *x, void *dst, int64_t k) {
    st_block_q6_k *y = dst;
    for (int64_t b = 0; b < k / ST_QK_K; b++, x += ST_QK_K) {
        int8_t L[ST_QK_K];
        float scales[16];
        float amax = 0.0f, max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(&y[b], 0, sizeof y[b]);
        if (amax < GROUP_EPS)
            continue;
        const float is = -128.0f / max_scale;
        put_fp16(&y[b].d, 1.0f / is);
        for (int j = 0; j < 16; j++) {
            const int v = nearest(is * scales[j]);
            y[b].scales[j] = (int8_t)(v < 127 ? v : 127);
        }
        const float d = get_fp16(&y[b].d);
        for (int j = 0; j < 16; j++) {
            const float dj = d * (float)y[b].scales[j];
            if (dj == 0.0f)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clampi(nearest(x[16 * j + l] / dj), -32, 31) + 32);
        }
        /* element 128h + 32s + l: nibble s/2 of ql[64h + 32(s%2) + l], bits 2s of qh[32h + l] */
        for (int e = 0; e < ST_QK_K; e++) {
            const int h = e / 128, s = e % 128 / 32, l = e % 32;
            const uint8_t q = (uint8_t)L[e];
            uint8_t *ql = &y[b].ql[64 * h + 32 * (s & 1) + l];
            *ql = (uint8_t)(*ql | (q & 0xf) << (4 * (s >> 1)));
            y[b].qh[32 * h + l] = (uint8_t)(y[b].qh[32 * h + l] | (q >> 4) << (2 * s));
        }
    }
}

int st_quantize_row_kquant(uint32_t type, const float *x, void *dst, int64_t n) {
    switch (type) {
    case ST_DTYPE_Q2_K:
        st_quantize_row_q2_k(x, dst, n);
        return 1;
    case ST_DTYPE_Q3_K:
        st_quantize_row_q3_k(x, dst, n);
        return 1;
    case ST_DTYPE_Q4_K:
        st_quantize_row_q4_k(x, dst, n);
        return 1;
    case ST_DTYPE_Q5_K:
        st_quantize_row_q5_k(x, dst, n);
        return 1;
    case ST_DTYPE_Q6_K:
        st_quantize_row_q6_k(x, dst, n);
        return 1;
    default:
        return 0;
    }
}
