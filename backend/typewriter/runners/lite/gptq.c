/* GPTQ's inner loop for int8-lite's rounding (gptq.py says what it computes): one group of input channels at a
 * time, each channel rounded and its error moving the group's channels not yet rounded, for a range of output
 * columns. Every column is independent, so a caller splits the columns between threads; within a tile of columns
 * the group's rows stay in cache while every channel of the group is rounded, where numpy made a temporary array
 * per channel. Built into the same library as attention.c (kernel.py). */
#include <math.h>
#include <stdint.h>

#define TILE_COLUMNS 512

/* w [groups, g, out] float32, updated in place; u [groups, g, g] float32 (upper Cholesky factors of each group's
 * H^-1); scale, inv_scale [out]; q [groups, g, out] int8. Columns c0..c1-1 only. err: scratch of TILE_COLUMNS. */
void typewriter_gptq(float *w, const float *u, int groups, int g, int64_t out, int64_t c0, int64_t c1,
                     const float *scale, const float *inv_scale, int8_t *q, float *err) {
    for (int b = 0; b < groups; b++) {
        float *wb = w + (int64_t)b * g * out;
        const float *ub = u + (int64_t)b * g * g;
        int8_t *qb = q + (int64_t)b * g * out;
        for (int64_t t0 = c0; t0 < c1; t0 += TILE_COLUMNS) {
            int64_t t1 = t0 + TILE_COLUMNS < c1 ? t0 + TILE_COLUMNS : c1;
            for (int j = 0; j < g; j++) {
                float *wj = wb + (int64_t)j * out;
                int8_t *qj = qb + (int64_t)j * out;
                float ujj = ub[j * g + j];
                for (int64_t c = t0; c < t1; c++) {
                    float r = nearbyintf(wj[c] * inv_scale[c]);  /* ties to even, as numpy's rint */
                    r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
                    qj[c] = (int8_t)r;
                    err[c - t0] = (wj[c] - r * scale[c]) / ujj;
                }
                for (int k = j + 1; k < g; k++) {
                    float ujk = ub[j * g + k];
                    float *wk = wb + (int64_t)k * out;
                    for (int64_t c = t0; c < t1; c++)
                        wk[c] -= ujk * err[c - t0];
                }
            }
        }
    }
}
