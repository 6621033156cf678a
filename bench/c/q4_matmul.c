/* A prototype for bench/q4_kernels.py: y [rows, out] = x [rows, in] @ W, W held in blocks of 32 input channels
 * with one float16 scale per block and output, at 4 bits (Q4: w = d * (q - 8), q in 0..15; Q4M, GGUF's Q4_1:
 * w = d * q + m with a float16 m per block too) or at 8 bits (Q8: w = d * q, q in -127..127). `format` names
 * them: 4, 41 and 8. The rows of x are quantized to 8 bits per block of 32 (one float scale each, as
 * llama.cpp's Q8_0 does), so a block's dot product is integer and is scaled once by both scales.
 *
 * Packed layout: outputs in groups of 16; a group holds its blocks in input order, each block the 16 outputs' 32
 * weights then their 16 float16 scales (then Q4M's 16 float16 minimums). Q4 block: 4 x 64 bytes, in chunk j
 * lane o (4 bytes) the weights of output o at inputs 4j..4j+3 in the low nibbles and 16+4j..16+4j+3 in the high
 * ones (+ 8, unsigned; Q4M's as they are). Q8 block: 8 x 64 bytes, chunk j lane o the weights at 4j..4j+3 (+ 128,
 * unsigned). So one VNNI vpdpbusd takes a chunk against the
 * row's 4 inputs broadcast to every lane: 16 outputs at once, no horizontal sums. The unsigned offset comes back
 * as offset x (the block's sum of the row's quantized inputs), computed once a row and block; Q4M's minimum
 * adds m x that sum.
 *
 * AVX-512 VNNI where the CPU has it, else AVX2 (vpmaddubsw + vpmaddwd: the same sums, two instructions). Groups are
 * shared with one helper thread, as attention.c's calls are: it spins a little, then sleeps. */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define BLOCK 32
#define LANES 16
#define ROW_TILE 8 /* rows computed together against one unpacked block */
#define CHUNK_GROUPS 4 /* groups a thread takes at a time */
#define SPIN 2000

static int weight_bits(int format) { return format == 8 ? 8 : 4; }
static int64_t block_bytes(int format) {
    return LANES * BLOCK * weight_bits(format) / 8 + LANES * 2 * (format == 41 ? 2 : 1);
}
static int64_t offset_of(int format) { return format == 4 ? 8 : format == 8 ? 128 : 0; } /* the unsigned offset */

/* ---- packing (not timed) ---- */

/* q [out, in] int8 (Q4: -8..7, Q4M: 0..15, Q8: -127..127), scales (and Q4M's mins) [out, in / 32] float16 bits
 * -> packed. */
void q4_pack(const int8_t *q, const uint16_t *scales, const uint16_t *mins, int64_t in, int64_t out, int format,
             uint8_t *packed) {
    const int64_t nb = in / BLOCK, bb = block_bytes(format), weights = LANES * BLOCK * weight_bits(format) / 8;
    const int off = (int)offset_of(format);
    for (int64_t g = 0; g < out / LANES; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *p = packed + (g * nb + b) * bb;
            for (int o = 0; o < LANES; o++) {
                const int8_t *w = q + (g * LANES + o) * in + b * BLOCK;
                if (format != 8) {
                    for (int j = 0; j < 4; j++)
                        for (int t = 0; t < 4; t++)
                            p[j * 64 + o * 4 + t] = (uint8_t)((w[4 * j + t] + off) | ((w[16 + 4 * j + t] + off) << 4));
                } else {
                    for (int j = 0; j < 8; j++)
                        for (int t = 0; t < 4; t++) p[j * 64 + o * 4 + t] = (uint8_t)(w[4 * j + t] + off);
                }
                memcpy(p + weights + o * 2, scales + (g * LANES + o) * nb + b, 2);
                if (format == 41) memcpy(p + weights + LANES * 2 + o * 2, mins + (g * LANES + o) * nb + b, 2);
            }
        }
}

/* ---- a row's inputs to 8 bits a block ---- */

static void quantize_rows(const float *x, int rows, int64_t in, int8_t *xq, float *dx, int32_t *sx) {
    const int64_t nb = in / BLOCK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + r * in + b * BLOCK;
            __m256 q[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_loadu_ps(v + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, q[i]));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            const float top = _mm_cvtss_f32(h), inv = top > 0 ? 127.0f / top : 0.0f;
            const __m256 scale = _mm256_set1_ps(inv);
            __m256i n[4];
            for (int i = 0; i < 4; i++) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(q[i], scale)); /* to nearest even */
            /* int32 -> int8 in input order: packs interleave 128-bit lanes, the permute puts them back */
            const __m256i p16a = _mm256_packs_epi32(n[0], n[1]), p16b = _mm256_packs_epi32(n[2], n[3]);
            const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                           _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(xq + r * in + b * BLOCK), p8);
            const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
            dx[r * nb + b] = top / 127.0f, sx[r * nb + b] = _mm_cvtsi128_si32(t);
        }
}

/* ---- the work of one call ---- */

typedef struct {
    const uint8_t *packed;
    const int8_t *xq;
    const float *dx;
    const int32_t *sx;
    float *y;
    int64_t in, out;
    int rows, format;
    _Atomic int64_t next; /* the next chunk of groups to take */
    _Atomic int left;     /* 1 once the helper, having taken this call, has finished with it */
} Call;

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define WIDE 1
static inline __attribute__((always_inline)) void group512(const Call *c, int64_t g, int r0, const int rt) {
    const int64_t nb = c->in / BLOCK, bb = block_bytes(c->format), offset = offset_of(c->format);
    const int64_t at = LANES * BLOCK * weight_bits(c->format) / 8; /* the scales' place in a block */
    const int four = c->format != 8, mins = c->format == 41;
    const uint8_t *p = c->packed + g * nb * bb;
    __m512 f[ROW_TILE];
    for (int r = 0; r < rt; r++) f[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++, p += bb) {
        __m512i w[8];
        if (four) {
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(p + 64 * j);
                w[j] = _mm512_and_si512(v, low);
                w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
        } else {
            for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(p + 64 * j);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + at)));
        const __m512 m = mins ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + at + 32))) : d;
        for (int r = 0; r < rt; r++) {
            const int32_t *x4 = (const int32_t *)(c->xq + (r0 + r) * c->in + b * BLOCK);
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            if (four) { /* chunk j: inputs 4j.. (low nibbles) and 16+4j.. (high) */
                for (int j = 0; j < 4; j++) {
                    a0 = _mm512_dpbusd_epi32(a0, w[j], _mm512_set1_epi32(x4[j]));
                    a1 = _mm512_dpbusd_epi32(a1, w[4 + j], _mm512_set1_epi32(x4[4 + j]));
                }
            } else {
                for (int j = 0; j < 8; j += 2) {
                    a0 = _mm512_dpbusd_epi32(a0, w[j], _mm512_set1_epi32(x4[j]));
                    a1 = _mm512_dpbusd_epi32(a1, w[j + 1], _mm512_set1_epi32(x4[j + 1]));
                }
            }
            const int64_t rb = (r0 + r) * nb + b;
            const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(a0, a1), _mm512_set1_epi32(offset * c->sx[rb]));
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(c->dx[rb])), f[r]);
            if (mins) f[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(c->dx[rb] * (float)c->sx[rb]), f[r]);
        }
    }
    for (int r = 0; r < rt; r++) _mm512_storeu_ps(c->y + (r0 + r) * c->out + g * LANES, f[r]);
}
#else
#define WIDE 0
#endif

/* AVX2: each 64-byte chunk as two halves of 8 lanes. vpmaddubsw adds pairs to 16 bits with saturation: Q4's
 * unsigned weights (at most 15) against 8-bit inputs never reach it; Q8's are made signed again and multiplied as
 * |w| against x with w's sign, so every pair stays within 2 x 127 x 127 (and no offset is taken back). */
static inline __attribute__((always_inline)) __m256i dot256(__m256i acc, __m256i w, int32_t x4) {
    const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static inline __attribute__((always_inline)) __m256i dot256s(__m256i acc, __m256i w, int32_t x4) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(x4), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static inline __attribute__((always_inline)) void group256(const Call *c, int64_t g, int r0, const int rt) {
    const int64_t nb = c->in / BLOCK, bb = block_bytes(c->format), offset = c->format == 8 ? 0 : offset_of(c->format);
    const int64_t at = LANES * BLOCK * weight_bits(c->format) / 8;
    const int four = c->format != 8, mins = c->format == 41;
    for (int half = 0; half < 2; half++) {
        const uint8_t *p = c->packed + g * nb * bb + 32 * half;
        __m256 f[ROW_TILE];
        for (int r = 0; r < rt; r++) f[r] = _mm256_setzero_ps();
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int64_t b = 0; b < nb; b++, p += bb) {
            __m256i w[8];
            if (four) {
                for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j));
                    w[j] = _mm256_and_si256(v, low);
                    w[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                }
            } else {
                const __m256i sign = _mm256_set1_epi8((char)0x80);
                for (int j = 0; j < 8; j++)
                    w[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 64 * j)), sign);
            }
            const uint8_t *s = p - 32 * half + at + 16 * half; /* this half's 8 scales */
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
            const __m256 m = mins ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32))) : d;
            for (int r = 0; r < rt; r++) {
                const int32_t *x4 = (const int32_t *)(c->xq + (r0 + r) * c->in + b * BLOCK);
                __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
                if (four) {
                    for (int j = 0; j < 4; j++) a0 = dot256(a0, w[j], x4[j]), a1 = dot256(a1, w[4 + j], x4[4 + j]);
                } else {
                    for (int j = 0; j < 8; j += 2) a0 = dot256s(a0, w[j], x4[j]), a1 = dot256s(a1, w[j + 1], x4[j + 1]);
                }
                const int64_t rb = (r0 + r) * nb + b;
                const __m256i dot = _mm256_sub_epi32(_mm256_add_epi32(a0, a1), _mm256_set1_epi32(offset * c->sx[rb]));
                f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(c->dx[rb])), f[r]);
                if (mins) f[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(c->dx[rb] * (float)c->sx[rb]), f[r]);
            }
        }
        for (int r = 0; r < rt; r++) _mm256_storeu_ps(c->y + (r0 + r) * c->out + g * LANES + 8 * half, f[r]);
    }
}

static int wide = WIDE;

int q4_wide(void) { return wide; }
void q4_set_wide(int on) { wide = on && WIDE; }

#define TILES(fn)                                                                            \
    switch (rt) {                                                                             \
        case 1: fn(c, g, r0, 1); break; case 2: fn(c, g, r0, 2); break;                       \
        case 3: fn(c, g, r0, 3); break; case 4: fn(c, g, r0, 4); break;                       \
        case 5: fn(c, g, r0, 5); break; case 6: fn(c, g, r0, 6); break;                       \
        case 7: fn(c, g, r0, 7); break; default: fn(c, g, r0, 8); break;                      \
    }

static void group(const Call *c, int64_t g) {
    for (int r0 = 0; r0 < c->rows; r0 += ROW_TILE) {
        const int rt = c->rows - r0 < ROW_TILE ? c->rows - r0 : ROW_TILE;
#if WIDE
        if (wide) { TILES(group512) continue; }
#endif
        TILES(group256)
    }
}

static void work(Call *c) {
    const int64_t groups = c->out / LANES;
    for (int64_t i; (i = atomic_fetch_add_explicit(&c->next, CHUNK_GROUPS, memory_order_relaxed)) < groups;)
        for (int64_t g = i; g < i + CHUNK_GROUPS && g < groups; g++) group(c, g);
}

/* ---- one helper thread, as attention.c's ---- */

static Call *_Atomic posted;
static _Atomic int sleeping, helper_state;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;

static void *helper(void *unused) {
    (void)unused;
    for (;;) {
        for (int spin = 0; spin < SPIN && !atomic_load(&posted); spin++) _mm_pause();
        if (!atomic_load(&posted)) {
            pthread_mutex_lock(&lock);
            atomic_store(&sleeping, 1);
            while (!atomic_load(&posted)) pthread_cond_wait(&wake, &lock);
            atomic_store(&sleeping, 0);
            pthread_mutex_unlock(&lock);
        }
        Call *call = atomic_exchange(&posted, NULL);
        if (call) {
            work(call);
            atomic_store_explicit(&call->left, 1, memory_order_release);
        }
    }
    return NULL;
}

static int helper_running(void) {
    if (atomic_load(&helper_state) == 0) {
        pthread_mutex_lock(&lock);
        if (atomic_load(&helper_state) == 0) {
            pthread_t thread;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            const int ok = pthread_create(&thread, &attr, helper, NULL) == 0;
            pthread_attr_destroy(&attr);
            atomic_store(&helper_state, ok ? 1 : -1);
        }
        pthread_mutex_unlock(&lock);
    }
    return atomic_load(&helper_state) == 1;
}

/* y [rows, out] = x [rows, in] @ W (packed by q4_pack in `format`); scratch: rows * in bytes, then rows * in / 32
 * floats and as many int32. in a multiple of 32, out of 16. `threads` 2: a helper thread takes groups too. */
void q4_matmul(const uint8_t *packed, const float *x, int rows, int64_t in, int64_t out, int format, float *y,
               void *scratch, int threads) {
    int8_t *xq = scratch;
    float *dx = (float *)(xq + ((rows * in + 63) & ~(int64_t)63));
    int32_t *sx = (int32_t *)(dx + rows * (in / BLOCK));
    quantize_rows(x, rows, in, xq, dx, sx);
    Call call = {packed, xq, dx, sx, y, in, out, rows, format, 0, 0};
    const int helped = threads > 1 && helper_running();
    if (helped) {
        atomic_store(&posted, &call);
        if (atomic_load(&sleeping)) {
            pthread_mutex_lock(&lock);
            pthread_cond_signal(&wake);
            pthread_mutex_unlock(&lock);
        }
    }
    work(&call);
    if (helped && atomic_exchange(&posted, NULL) == NULL)
        for (int spin = 0; !atomic_load_explicit(&call.left, memory_order_acquire); spin++)
            spin < SPIN ? _mm_pause() : (void)sched_yield();
}

/* n matmuls in one call, matrix i [ins[i], outs[i]] with its own packed weights and output, each from the first
 * ins[i] inputs of each row of x [rows, x_width] (each quantizes its rows again, as matrices with inputs of their
 * own would): a chain without Python between the matrices. */
void q4_matmul_many(int n, const uint8_t *const *packed, const float *x, int rows, int64_t x_width,
                    const int64_t *ins, const int64_t *outs, int format, float *const *y, void *scratch, int threads) {
    for (int i = 0; i < n; i++) {
        const float *rows_x = x;
        if (ins[i] != x_width) { /* the rows' first ins[i] inputs, contiguous (scratch's second half) */
            float *packed_rows = (float *)((uint8_t *)scratch + rows * x_width * 2 + 64);
            for (int r = 0; r < rows; r++) memcpy(packed_rows + r * ins[i], x + r * x_width, ins[i] * sizeof(float));
            rows_x = packed_rows;
        }
        q4_matmul(packed[i], rows_x, rows, ins[i], outs[i], format, y[i], scratch, threads);
    }
}
