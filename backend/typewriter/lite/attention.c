/* Attention over the host K/V cache for int8-lite: attention.py's kernel, built and loaded by kernel.py.

   One routine computes every query row, a decode row or a prompt-chunk row alike, from that row and its slot's
   cache alone, each in a fixed order: a score adds its e products in order, a row's maximum and sum go through
   8 lanes (position j in lane j % 8) and then a fixed tree, and the values add position after position. So a
   token's output is the same bits whether it is decoded, prefilled in a chunk of any size at any start, or
   batched with other rows, and a greedy answer cannot depend on how the scheduler cut a prompt or what it reused.

   The cache holds float16 (half the bytes to read: a decode row at 1,400 positions reads 1 MB a layer), converted
   with F16C. AVX2, FMA and F16C: every x86-64 machine this runs on (Intel since Haswell, AMD since Zen). */

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

/* 8 float16 values (their bits) as floats. */
static inline __m256 half8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

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
static void rows(const float *const *q, const int *n, int count, const uint16_t *restrict keys, int padded,
                 const uint16_t *restrict values, int e, float *restrict scores, float *const *out) {
    const float *row[ROWS];
    int most = 0;
    for (int r = 0; r < ROWS; r++) row[r] = q[r < count ? r : 0];  /* spare lanes repeat row 0, then go unused */
    for (int r = 0; r < count; r++) most = n[r] > most ? n[r] : most;
    const int tiles = (most + TILE - 1) / TILE;
    for (int j0 = 0; j0 < tiles * TILE; j0 += TILE) {
        __m256 acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int c = 0; c < e; c++) {
            const uint16_t *tile = keys + (int64_t)j0 * e + c * TILE;  /* tile j0 / TILE, channel c */
            const __m256 k0 = half8(tile), k1 = half8(tile + W);
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
            const __m256 v0 = half8(values + (int64_t)j * e + c0), v1 = half8(values + (int64_t)j * e + c0 + W);
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

/* Whether every slot is below `slot_count` and every position below `positions_below` (both at least 0). */
static int inside(const int64_t *slots, const int64_t *positions, int t, int64_t slot_count, int64_t positions_below) {
    for (int i = 0; i < t; i++)
        if (slots[i] < 0 || slots[i] >= slot_count || positions[i] < 0 || positions[i] >= positions_below) return 0;
    return 1;
}

/* q and out [t, k, g, e] (q RoPE'd and scaled); keys [slots, k, stride / TILE, e, TILE] and values
   [slots, k, stride, e]; row (i, h, r) is slot slots[i]'s token at positions[i], attending to that slot's positions
   0..positions[i]. Consecutive tokens of one slot (a prompt chunk) are computed ROWS rows at a time. Returns 0, -1
   for a head size that is not a multiple of TILE, -2 when out of memory, -3 for a slot or position outside
   the cache (nothing written then). */
int typewriter_attend(const float *q, const int64_t *slots, const int64_t *positions, int t, int k, int g, int e,
                      const uint16_t *keys, const uint16_t *values, int64_t slot_count, int64_t stride, float *out) {
    if (e % TILE) return -1;
    if (!inside(slots, positions, t, slot_count, stride)) return -3;
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

/* Rotate-half RoPE (Hugging Face layout) of one head x [e] at angles cos/sin [e / 2], times scale, into y. */
static void rope(const float *restrict x, const float *restrict cos, const float *restrict sin, int e, float scale,
                 float *restrict y) {
    const int half = e / 2;
    for (int c = 0; c < half; c++) {
        y[c] = (x[c] * cos[c] - x[c + half] * sin[c]) * scale;
        y[c + half] = (x[c + half] * cos[c] + x[c] * sin[c]) * scale;
    }
}

/* A layer's qkv rows [t, (h + 2k) * e] for slot slots[i] at positions[i]: q (RoPE'd, times scale) into q_out
   [t, h, e]; k (RoPE'd) and v into the caches (layouts as typewriter_attend's). cos/sin: [angles, e / 2]. Returns
   0, or typewriter_attend's -1 and -3 (nothing written then). */
int typewriter_write(const float *qkv, const int64_t *slots, const int64_t *positions, int t, int h, int k, int e,
                     const float *cos, const float *sin, int64_t angles, float scale, uint16_t *keys,
                     uint16_t *values, int64_t slot_count, int64_t stride, float *q_out) {
    if (e % TILE) return -1;
    if (!inside(slots, positions, t, slot_count, angles < stride ? angles : stride)) return -3;
    const int width = (h + 2 * k) * e, half = e / 2;
    const int64_t head = stride * e, slot = k * head;
    float rotated[e];
    for (int i = 0; i < t; i++) {
        const float *row = qkv + (int64_t)i * width, *c = cos + positions[i] * half, *s = sin + positions[i] * half;
        const int64_t p = positions[i];
        for (int a = 0; a < h; a++) rope(row + a * e, c, s, e, scale, q_out + ((int64_t)i * h + a) * e);
        for (int b = 0; b < k; b++) {
            rope(row + (h + b) * e, c, s, e, 1.0f, rotated);
            uint16_t *tile = keys + slots[i] * slot + b * head + (p / TILE) * TILE * e + p % TILE;
            for (int x = 0; x < e; x++) tile[x * TILE] = _cvtss_sh(rotated[x], _MM_FROUND_TO_NEAREST_INT);
            uint16_t *v = values + slots[i] * slot + b * head + p * e;
            for (int x = 0; x < e; x += W)
                _mm_storeu_si128((__m128i *)(v + x), _mm256_cvtps_ph(_mm256_loadu_ps(row + (h + k + b) * e + x),
                                                                    _MM_FROUND_TO_NEAREST_INT));
        }
    }
    return 0;
}
