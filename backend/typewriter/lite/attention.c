/* Attention over the host K/V cache for int8-lite: attention.py's kernel, built and loaded by kernel.py.

   One routine computes every query row, a decode row or a prompt-chunk row alike, from that row and its slot's
   cache alone, each in a fixed order: a score adds its e products in order, a row's maximum and sum go through
   8 lanes (position j in lane j % 8) and then a fixed tree, and the values add position after position. So a
   token's output is the same bits whether it is decoded, prefilled in a chunk of any size at any start, or
   batched with other rows, and a greedy answer cannot depend on how the scheduler cut a prompt or what it reused.

   AVX2 and FMA (every x86-64 machine this runs on: Intel since Haswell, AMD since Zen). */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define W 8      /* floats in a vector */
#define TILE 16  /* positions a score tile holds: two vectors */
#define ROWS 4   /* query rows computed together, so a key or value is loaded once for all of them */

/* exp(x) for every lane, as Cephes' expf: x = m ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r and 2^m
   from the exponent bits; about 2 ulp. x below -87 gives e^-87 (1.6e-38), where callers want 0 they say so. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 m = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(m, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(m, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i two = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(m), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two));
}

static inline float lanes_max(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_shuffle_ps(a, a, 1)));
}

static inline float lanes_sum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_shuffle_ps(a, a, 1)));
}

/* `count` (1..ROWS) query rows of one kv head: q[r] [e] attends to positions 0..n[r]-1, into out[r] [e].
   keys [tiles, e, TILE]: each tile of positions stored channel-major, so a channel's TILE keys are one load.
   scores: ROWS * padded floats. */
static void rows(const float *const *q, const int *n, int count, const float *restrict keys, int padded,
                 const float *restrict values, int e, float *restrict scores, float *const *out) {
    const float *row[ROWS];
    int most = 0;
    for (int r = 0; r < ROWS; r++) row[r] = q[r < count ? r : 0];  /* spare lanes repeat row 0, then go unused */
    for (int r = 0; r < count; r++) most = n[r] > most ? n[r] : most;
    const int tiles = (most + TILE - 1) / TILE;
    for (int j0 = 0; j0 < tiles * TILE; j0 += TILE) {
        __m256 acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int c = 0; c < e; c++) {
            const float *tile = keys + (int64_t)j0 * e + c * TILE;  /* tile j0 / TILE, channel c */
            const __m256 k0 = _mm256_loadu_ps(tile), k1 = _mm256_loadu_ps(tile + W);
            for (int r = 0; r < ROWS; r++) {
                const __m256 qc = _mm256_broadcast_ss(row[r] + c);
                acc[r][0] = _mm256_fmadd_ps(qc, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qc, k1, acc[r][1]);
            }
        }
        for (int r = 0; r < count; r++) {
            _mm256_storeu_ps(scores + (int64_t)r * padded + j0, acc[r][0]);
            _mm256_storeu_ps(scores + (int64_t)r * padded + j0 + W, acc[r][1]);
        }
    }
    float inverse[ROWS];
    for (int r = 0; r < count; r++) {
        float *restrict s = scores + (int64_t)r * padded;
        const int whole = (n[r] + W - 1) / W * W;  /* this row's own vectors: n[r] alone decides them */
        for (int j = n[r]; j < whole; j++) s[j] = -INFINITY;
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < whole; j += W) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
        const __m256 peak = _mm256_set1_ps(lanes_max(top));
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < whole; j += W) {
            __m256 e8 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), peak));
            if (j + W > n[r])  /* the positions past the row's own weigh exactly 0 */
                e8 = _mm256_blendv_ps(e8, _mm256_setzero_ps(),
                                      _mm256_cmp_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
            _mm256_storeu_ps(s + j, e8);
            sum = _mm256_add_ps(sum, e8);
        }
        for (int j = whole; j < tiles * TILE; j++) s[j] = 0.0f;
        inverse[r] = 1.0f / lanes_sum(sum);
    }
    for (int c0 = 0; c0 < e; c0 += TILE) {
        __m256 acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int j = 0; j < most; j++) {
            const __m256 v0 = _mm256_loadu_ps(values + (int64_t)j * e + c0);
            const __m256 v1 = _mm256_loadu_ps(values + (int64_t)j * e + c0 + W);
            for (int r = 0; r < ROWS; r++) {
                const __m256 w = _mm256_broadcast_ss(scores + (int64_t)(r < count ? r : 0) * padded + j);
                acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
            }
        }
        for (int r = 0; r < count; r++) {
            const __m256 scale = _mm256_set1_ps(inverse[r]);
            _mm256_storeu_ps(out[r] + c0, _mm256_mul_ps(acc[r][0], scale));
            _mm256_storeu_ps(out[r] + c0 + W, _mm256_mul_ps(acc[r][1], scale));
        }
    }
}

/* q and out [t, k, g, e] (q RoPE'd and scaled); keys [slots, k, stride / TILE, e, TILE] and values
   [slots, k, stride, e]; row (i, h, r) is slot slots[i]'s token at positions[i], attending to that slot's positions
   0..positions[i]. Consecutive tokens of one slot (a prompt chunk) are computed ROWS rows at a time. Returns 0, -1
   for a head size that is not a multiple of TILE, -2 when out of memory (nothing written then). */
int typewriter_attend(const float *q, const int64_t *slots, const int64_t *positions, int t, int k, int g, int e,
                      const float *keys, const float *values, int64_t stride, float *out) {
    if (e % TILE) return -1;
    int most = 0;
    for (int i = 0; i < t; i++) most = (int)positions[i] + 1 > most ? (int)positions[i] + 1 : most;
    const int padded = (most + TILE - 1) / TILE * TILE;
    float *scratch = malloc(sizeof(float) * ROWS * (size_t)padded);
    if (!scratch) return -2;
    const int64_t head = stride * e, slot = k * head;
    for (int h = 0; h < k; h++) {
        const float *group[ROWS];
        float *outs[ROWS];
        int n[ROWS], count = 0;
        for (int i = 0; i < t; i++) {
            if (count && slots[i] != slots[i - 1]) {  /* another slot: another cache */
                rows(group, n, count, keys + slots[i - 1] * slot + h * head, padded,
                     values + slots[i - 1] * slot + h * head, e, scratch, outs);
                count = 0;
            }
            for (int r = 0; r < g; r++) {
                const int64_t at = (((int64_t)i * k + h) * g + r) * e;
                group[count] = q + at, outs[count] = out + at, n[count] = (int)positions[i] + 1;
                if (++count == ROWS) {
                    rows(group, n, count, keys + slots[i] * slot + h * head, padded,
                         values + slots[i] * slot + h * head, e, scratch, outs);
                    count = 0;
                }
            }
        }
        if (count)
            rows(group, n, count, keys + slots[t - 1] * slot + h * head, padded, values + slots[t - 1] * slot + h * head,
                 e, scratch, outs);
    }
    free(scratch);
    return 0;
}
