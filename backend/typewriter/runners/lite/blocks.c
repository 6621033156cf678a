/* q4-blocks' kernel: a Llama-family decoder's matmuls on the GGUF file's own blocks, for every step of it, a
   student's one row or a class's batch (blocks.py repacks the file and calls it; kernel.py builds it into one
   library with attention.c).

   A matrix W [out, in] is held in blocks of 32 inputs, each with a float16 scale per output: at 4 bits as Q4
   (w = d * (q - 8), GGUF's Q4_0), Q4M (w = d * q + m with a float16 minimum too: Q4_1), at 5 bits as Q5
   (w = d * (q - 16): Q5_0) and Q5M (Q5_1, Q5_K's sub-blocks), or at 8 bits as Q8 (w = d * q, q in -127..127: Q8_0
   and the types rounded to it). Or as a K-quant's super-blocks of 256 inputs hold them, a float16 d for each and a
   byte for each sub-block: Q4K (Q4_K: w = d * sc * q - dmin * m, sc and m 6-bit) and Q6K (Q6_K, at 6 bits:
   w = d * sc * (q - 32), an int8 sc for each half of a block). `format` names them: 4, 41, 5, 51, 8, 42, 62. Rows
   are quantized to 8 bits a block of 32 (one float scale each, as llama.cpp's Q8_0), so a block's dot product is an
   exact integer, scaled once by both scales.

   Packed layout: outputs in groups of 16 (the last padded with zero weights); a group holds its blocks in input
   order, each block the 16 outputs' weights, then their 16 float16 scales (then Q4M's or Q5M's 16 minimums). Q4 block:
   4 x 64 bytes, chunk j lane o holding output o's weights at inputs 4j..4j+3 in the low nibbles and 16+4j..16+4j+3
   in the high ones (unsigned: Q4's + 8); Q5 block: Q4's 4 x 64 bytes of low nibbles, then 8 64-bit masks of their
   fifth bits, mask k's bit 4o + t that of the byte the nibble k (0-3 low, 4-7 high) of chunk k % 4, lane o, byte t
   becomes (unsigned: Q5's + 16), so one masked add of 16 a chunk makes the weights; Q8 block: 8 x 64 bytes, chunk
   j lane o the weights at 4j..4j+3 (+ 128). Q4K's blocks are Q4M's weights alone; Q6K's Q5's, then 8 more masks of
   the sixth bits (unsigned: Q6K's + 32; a second masked add, of 32); each 8 after a header (header_bytes) with
   their scales.
   One VNNI vpdpbusd then takes a chunk against 4 inputs of the row broadcast to every lane: 16 outputs at once, no
   horizontal sums. The unsigned offset comes back as offset x the block's sum of the row's quantized inputs.

   AVX-512 VNNI where the CPU has it, else AVX2 (vpmaddubsw + vpmaddwd). Both sum the same exact integers and
   scale them with the same float operations in the same order, so they give the same bits; and each row is
   computed alone, so a row's result does not depend on the rows beside it. A call's groups are shared with one
   helper thread, as attention.c's are; either thread computes a group the same way.

   typewriter_blocks_layers runs every layer of a step in one call (RMSNorm, q/k/v, attention.c's RoPE, cache
   write and attention, o, SiLU-gated MLP, the residual adds): no Python between the matrices
   (docs/measurements/2026-12-05-4-bit-weights-research.md, "Recommendation"). */

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
#define LANES 16
/* Rows computed together against one unpacked block: more share each unpacking until the registers run out. On
   AVX-512, with each format compiled alone, 6 made a batched step faster than 4 and 8 no faster than 6
   (docs/measurements/2026-12-06-q4-blocks-alone.md; AVX2's 2: 2026-12-05-gguf-blocks-kernel.md). */
#define ROW_TILE 6     /* AVX-512: 32 registers */
#define ROW_TILE256 2  /* AVX2: 16 */
#define LEAST_TAKE 2   /* the fewest groups a thread takes at a time */
#define SPIN 2000
/* Bytes ahead of the block being read that each block's loop asks the cache for: the hardware's prefetcher alone left
   a student's step at about half the machine's read bandwidth; into L2, as far ahead as measured best
   (docs/measurements/2026-12-06-prefetch.md). */
#define PREFETCH 4096
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

enum { Q4 = 4, Q4M = 41, Q4K = 42, Q5 = 5, Q5M = 51, Q6K = 62, Q8 = 8 };
#define SUPER 8 /* blocks of a K-quant's super-block of 256 inputs */

static int is_k(int format) { return format == Q4K || format == Q6K; }
static int weight_bits(int format) {
    return format == Q8 ? 8 : format == Q6K ? 6 : format == Q5 || format == Q5M ? 5 : 4;
}
static int has_mins(int format) { return format == Q4M || format == Q5M || format == Q4K; }
static int64_t weight_bytes(int format) { return LANES * BLOCK * weight_bits(format) / 8; }
/* A block's weights, then for each output float16s: a scale, and a minimum (Q4M, Q5M). A K-quant's block is its
   weights alone: its scales are in its super-block's header. */
static int64_t block_bytes(int format) {
    return weight_bytes(format) + (is_k(format) ? 0 : LANES * 2 * (has_mins(format) ? 2 : 1));
}
/* A K-quant's super-block header, before its SUPER blocks: each output's float16 d, then Q4K's dmin (Q6K leaves
   those 32 bytes empty); then for each block each output's byte of its first scale (Q4K's 6-bit scale, Q6K's first
   half's int8), then of its second (Q4K's 6-bit minimum, Q6K's second half's): 320 bytes, so that every block starts
   on a cache line (with the scale bytes after each block's weights a row's step was no faster and a batch's slower:
   docs/measurements/2026-12-06-k-quant-scales.md). */
#define K_SCALES 64 /* where a header's blocks' scales start */
static int64_t header_bytes(int format) { return is_k(format) ? K_SCALES + SUPER * LANES * 2 : 0; }
/* the unsigned offset */
static int offset_of(int format) {
    return format == Q4 ? 8 : format == Q5 ? 16 : format == Q6K ? 32 : format == Q8 ? 128 : 0;
}
/* Bytes of one group of 16 outputs */
static int64_t group_bytes(int64_t in, int format) {
    return in / BLOCK * block_bytes(format) + in / (BLOCK * SUPER) * header_bytes(format);
}

/* Bytes of a packed matrix of `in` inputs and `out` outputs, 0 for a shape or format it cannot hold. */
int64_t typewriter_blocks_bytes(int64_t in, int64_t out, int format) {
    if (in <= 0 || out <= 0 || in % BLOCK || (format != Q4 && format != Q4M && format != Q4K && format != Q5 &&
                                              format != Q5M && format != Q6K && format != Q8))
        return 0;
    if (is_k(format) && in % (BLOCK * SUPER)) return 0;
    return (out + LANES - 1) / LANES * group_bytes(in, format);
}

/* q [out, in] int8 (Q4: -8..7, Q4M, Q4K: 0..15, Q5: -16..15, Q5M: 0..31, Q6K: -32..31, Q8: -127..127), scales
   (and Q4M's and Q5M's minimums) [out, in / 32] float16 bits -> packed (typewriter_blocks_bytes of it). K-quants:
   Q4K's scales and minimums [out, in / 32] uint8 (0..63) and supers [out, in / 256, 2] float16 bits (d, dmin); Q6K's
   scales and second halves' scales [out, in / 32] int8 and supers [out, in / 256] (d). */
void typewriter_blocks_pack(const int8_t *q, const void *scales, const void *mins, const uint16_t *supers,
                            int64_t in, int64_t out, int format, uint8_t *packed) {
    const int64_t nb = in / BLOCK, bb = block_bytes(format), weights = weight_bytes(format), hb = header_bytes(format);
    const int off = offset_of(format), masks = weight_bits(format) == 6 ? 16 : weight_bits(format) == 5 ? 8 : 0;
    const int k = is_k(format), per_super = format == Q4K ? 2 : 1;
    memset(packed, 0, (size_t)typewriter_blocks_bytes(in, out, format));
    for (int64_t g = 0; g < (out + LANES - 1) / LANES; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *p = packed + g * group_bytes(in, format) + b * bb + (k ? (b / SUPER + 1) * hb : 0);
            uint8_t *header = k ? p - (b % SUPER) * bb - hb : NULL;
            if (k && b % SUPER == 0) /* each output's d, then Q4K's dmin */
                for (int o = 0; o < LANES && g * LANES + o < out; o++)
                    for (int s = 0; s < per_super; s++)
                        memcpy(header + s * LANES * 2 + o * 2,
                               supers + ((g * LANES + o) * (nb / SUPER) + b / SUPER) * per_super + s, 2);
            uint64_t high[16] = {0}; /* the fifth bits' masks, then the sixth's */
            for (int o = 0; o < LANES; o++) {
                /* a padded output's weights are the offset, so they sum to zero against any row */
                const int real = g * LANES + o < out;
                const int8_t *w = real ? q + (g * LANES + o) * in + b * BLOCK : NULL;
                if (format != Q8) {
                    for (int j = 0; j < 4; j++)
                        for (int t = 0; t < 4; t++) {
                            const int lo = (real ? w[4 * j + t] : 0) + off, hi = (real ? w[16 + 4 * j + t] : 0) + off;
                            p[j * 64 + o * 4 + t] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                            high[j] |= (uint64_t)(lo >> 4 & 1) << (4 * o + t);
                            high[4 + j] |= (uint64_t)(hi >> 4 & 1) << (4 * o + t);
                            high[8 + j] |= (uint64_t)(lo >> 5 & 1) << (4 * o + t);
                            high[12 + j] |= (uint64_t)(hi >> 5 & 1) << (4 * o + t);
                        }
                } else {
                    for (int j = 0; j < 8; j++)
                        for (int t = 0; t < 4; t++) p[j * 64 + o * 4 + t] = (uint8_t)((real ? w[4 * j + t] : 0) + off);
                }
                if (!real) continue;
                if (k) {
                    uint8_t *at = header + K_SCALES + (b % SUPER) * LANES * 2;
                    at[o] = ((const uint8_t *)scales)[(g * LANES + o) * nb + b];
                    at[LANES + o] = ((const uint8_t *)mins)[(g * LANES + o) * nb + b];
                    continue;
                }
                memcpy(p + weights + o * 2, (const uint16_t *)scales + (g * LANES + o) * nb + b, 2);
                if (has_mins(format))
                    memcpy(p + weights + LANES * 2 + o * 2, (const uint16_t *)mins + (g * LANES + o) * nb + b, 2);
            }
            if (masks) memcpy(p + LANES * BLOCK / 2, high, 8 * (size_t)masks);
        }
}

/* ---- a row's inputs to 8 bits a block: xq, its scale dx, its sum sx and the sum of its first half sxl ---- */

static inline int32_t sum8(__m256i s32) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}

static void quantize_rows(const float *x, int rows, int64_t in, int64_t stride, int8_t *xq, float *dx, int32_t *sx,
                          float *dsx, int32_t *sxl) {
    const int64_t nb = in / BLOCK;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + r * stride + b * BLOCK;
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
            const int32_t first = sum8(_mm256_add_epi32(n[0], n[1]));
            dx[r * nb + b] = top / 127.0f, sx[r * nb + b] = first + sum8(_mm256_add_epi32(n[2], n[3]));
            sxl[r * nb + b] = first;
            dsx[r * nb + b] = dx[r * nb + b] * (float)sx[r * nb + b];
        }
}

/* ---- the work of one matmul ---- */

typedef struct {
    const uint8_t *packed;
    const int8_t *xq;
    const float *dx;
    const int32_t *sx;
    const float *dsx; /* dx x sx, the factor of Q4M's minimums */
    const int32_t *sxl; /* the sums of the blocks' first 16 inputs (Q6K's two scales) */
    float *y;
    int64_t in, out, y_stride;
    int rows, format;
} Call;

/* A run of weights for the helper to ask the cache for (see `warm_until_posted`). */
typedef struct Warm {
    const uint8_t *at;
    int64_t bytes;
} Warm;

/* Matrices of one input, computed in one job: their groups numbered one after another, so the helper thread is
   handed them once (q, k and v; gate and up) and each row is quantized once. */
#define MOST_PARTS 3
typedef struct {
    Call part[MOST_PARTS];
    int parts;
    int64_t first[MOST_PARTS + 1]; /* part p's groups are first[p] .. first[p + 1] - 1 */
    _Atomic int64_t next;          /* groups taken */
    _Atomic int left;              /* 1 once the helper, having taken this job, has finished with it */
    void (*task)(void *);          /* set: the helper runs task(arg) instead (attention's groups, `share`) */
    void *arg;
    struct Warm warm;              /* the next job's weights, which the helper asks the cache for once done */
} Job;

/* Lanes of group g that are real outputs (the last group may be padded). */
static inline int lanes_of(const Call *c, int64_t g) { return c->out - g * LANES < LANES ? (int)(c->out - g * LANES) : LANES; }

/* A K-quant's 16 bytes of sub-block scales as floats: Q4K's unsigned, Q6K's signed */
static inline __attribute__((always_inline)) VNNI __m512 k_scales512(const uint8_t *s, const int format) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    return _mm512_cvtepi32_ps(format == Q4K ? _mm512_cvtepu8_epi32(v) : _mm512_cvtepi8_epi32(v));
}

static inline __attribute__((always_inline)) VNNI void group512(const Call *c, int64_t g, int r0, const int rt,
                                                                 const int format) {
    const int64_t nb = c->in / BLOCK, bb = block_bytes(format), at = weight_bytes(format), hb = header_bytes(format);
    const int four = format != Q8, five = weight_bits(format) >= 5, six = format == Q6K, mins = has_mins(format);
    const int offset = offset_of(format), k = is_k(format);
    const uint8_t *p = c->packed + g * group_bytes(c->in, format);
    __m512 f[ROW_TILE];
    for (int r = 0; r < rt; r++) f[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16), thirty_two = _mm512_set1_epi8(32);
    __m512 super_d = _mm512_setzero_ps(), super_min = super_d; /* a K-quant's d, and Q4K's -dmin */
    const uint8_t *header = p, *ahead = p + PREFETCH; /* the next line to ask the cache for */
    for (int64_t b = 0; b < nb; b++, p += bb) {
        if (k && b % SUPER == 0) {
            header = p;
            super_d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
            if (mins) /* negated as a sign bit, so that (-dmin) x m is -(dmin x m) to the bit */
                super_min = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)))),
                    _mm512_set1_epi32((int)0x80000000u)));
            p += hb;
        }
        for (; ahead < p + PREFETCH + bb; ahead += 64) _mm_prefetch((const char *)ahead, _MM_HINT_T1);
        __m512i w[8];
        if (four) {
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(p + 64 * j);
                w[j] = _mm512_and_si512(v, low);
                w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
            if (five) /* the fifth bits' 8 masks, then Q6K's sixth */
                for (int i = 0; i < (six ? 16 : 8); i++) {
                    uint64_t bits;
                    memcpy(&bits, p + LANES * BLOCK / 2 + 8 * i, 8);
                    const __m512i bit = i < 8 ? sixteen : thirty_two;
                    w[i % 8] = _mm512_mask_add_epi8(w[i % 8], _cvtu64_mask64(bits), w[i % 8], bit);
                }
        } else {
            for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(p + 64 * j);
        }
        __m512 d, m;
        if (k) { /* Q4K: d x sc and -dmin x m, in float32 as llama.cpp's; Q6K: d x each half's int8 scale */
            const uint8_t *s = header + K_SCALES + (b % SUPER) * LANES * 2;
            d = _mm512_mul_ps(super_d, k_scales512(s, format));
            m = _mm512_mul_ps(format == Q4K ? super_min : super_d, k_scales512(s + LANES, format));
        } else {
            d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + at)));
            m = mins ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + at + 32))) : d;
        }
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
            if (six) { /* a0: inputs 0-15 at the scale d, a1: 16-31 at the scale m */
                const __m512 dx = _mm512_set1_ps(c->dx[rb]);
                const __m512i d0 = _mm512_sub_epi32(a0, _mm512_set1_epi32(offset * c->sxl[rb]));
                const __m512i d1 = _mm512_sub_epi32(a1, _mm512_set1_epi32(offset * (c->sx[rb] - c->sxl[rb])));
                f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(d, dx), f[r]);
                f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(m, dx), f[r]);
                continue;
            }
            __m512i dot = _mm512_add_epi32(a0, a1);
            if (offset) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(offset * c->sx[rb]));
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(c->dx[rb])), f[r]);
            if (mins) f[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(c->dsx[rb]), f[r]);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << lanes_of(c, g)) - 1);
    for (int r = 0; r < rt; r++) _mm512_mask_storeu_ps(c->y + (r0 + r) * c->y_stride + g * LANES, keep, f[r]);
}

/* 32 bits -> 32 bytes, byte i 0xFF where bit i is set (llama.cpp's bytes_from_bits_32). */
static inline __attribute__((always_inline)) __m256i bytes_of_bits(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                             _mm256_set1_epi64x(-1));
}

/* AVX2: each 64-byte chunk as two halves of 8 lanes. vpmaddubsw adds pairs to 16 bits with saturation: Q4's, Q5's
   and Q6K's unsigned weights (at most 63: 2 x 63 x 127 < 32,767) against 8-bit inputs never reach it; Q8's are made
   signed again and multiplied as |w| against x with w's sign, so every pair stays within 2 x 127 x 127 (and no
   offset is taken back). */
static inline __attribute__((always_inline)) __m256i dot256(__m256i acc, __m256i w, int32_t x4) {
    const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static inline __attribute__((always_inline)) __m256i dot256s(__m256i acc, __m256i w, int32_t x4) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(x4), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* k_scales512's, 8 bytes */
static inline __attribute__((always_inline)) __m256 k_scales256(const uint8_t *s, const int format) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)s);
    return _mm256_cvtepi32_ps(format == Q4K ? _mm256_cvtepu8_epi32(v) : _mm256_cvtepi8_epi32(v));
}

static inline __attribute__((always_inline)) void group256(const Call *c, int64_t g, int r0, const int rt) {
    const int format = c->format;
    const int64_t nb = c->in / BLOCK, bb = block_bytes(format), at = weight_bytes(format), hb = header_bytes(format);
    const int four = format != Q8, five = weight_bits(format) >= 5, six = format == Q6K, k = is_k(format);
    const int mins = has_mins(format);
    const int offset = format == Q8 ? 0 : offset_of(format), lanes = lanes_of(c, g);
    for (int half = 0; half < 2 && 8 * half < lanes; half++) {
        const uint8_t *p = c->packed + g * group_bytes(c->in, format) + 32 * half;
        __m256 f[ROW_TILE256];
        for (int r = 0; r < rt; r++) f[r] = _mm256_setzero_ps();
        const __m256i low = _mm256_set1_epi8(0x0F);
        __m256 super_d = _mm256_setzero_ps(), super_min = super_d; /* as group512's, this half's 8 outputs */
        const uint8_t *header = p, *ahead = p + PREFETCH; /* as group512's */
        for (int64_t b = 0; b < nb; b++, p += bb) {
            if (k && b % SUPER == 0) {
                header = p - 32 * half;
                const uint8_t *h = header + 16 * half;
                super_d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
                if (mins)
                    super_min = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 32))),
                                              _mm256_set1_ps(-0.0f));
                p += hb;
            }
            for (; ahead < p + PREFETCH + bb; ahead += 64) _mm_prefetch((const char *)ahead, _MM_HINT_T1);
            __m256i w[8];
            if (four) {
                for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j));
                    w[j] = _mm256_and_si256(v, low);
                    w[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                }
                if (five) /* this half's 32 bits of each mask, a bit to a byte: the fifth bits, then Q6K's sixth */
                    for (int i = 0; i < (six ? 16 : 8); i++) {
                        uint32_t bits;
                        memcpy(&bits, p - 32 * half + LANES * BLOCK / 2 + 8 * i + 4 * half, 4);
                        const __m256i bit = _mm256_set1_epi8(i < 8 ? 16 : 32);
                        w[i % 8] = _mm256_or_si256(w[i % 8], _mm256_and_si256(bytes_of_bits(bits), bit));
                    }
            } else {
                const __m256i sign = _mm256_set1_epi8((char)0x80);
                for (int j = 0; j < 8; j++)
                    w[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 64 * j)), sign);
            }
            __m256 d, m;
            if (k) { /* this half's 8 bytes of each */
                const uint8_t *s = header + K_SCALES + (b % SUPER) * LANES * 2 + 8 * half;
                d = _mm256_mul_ps(super_d, k_scales256(s, format));
                m = _mm256_mul_ps(format == Q4K ? super_min : super_d, k_scales256(s + LANES, format));
            } else {
                const uint8_t *s = p - 32 * half + at + 16 * half; /* this half's 8 scales */
                d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
                m = mins ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32))) : d;
            }
            for (int r = 0; r < rt; r++) {
                const int32_t *x4 = (const int32_t *)(c->xq + (r0 + r) * c->in + b * BLOCK);
                __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
                if (four) {
                    for (int j = 0; j < 4; j++) a0 = dot256(a0, w[j], x4[j]), a1 = dot256(a1, w[4 + j], x4[4 + j]);
                } else {
                    for (int j = 0; j < 8; j += 2) a0 = dot256s(a0, w[j], x4[j]), a1 = dot256s(a1, w[j + 1], x4[j + 1]);
                }
                const int64_t rb = (r0 + r) * nb + b;
                if (six) { /* as group512's */
                    const __m256 dx = _mm256_set1_ps(c->dx[rb]);
                    const __m256i d0 = _mm256_sub_epi32(a0, _mm256_set1_epi32(offset * c->sxl[rb]));
                    const __m256i d1 = _mm256_sub_epi32(a1, _mm256_set1_epi32(offset * (c->sx[rb] - c->sxl[rb])));
                    f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(d, dx), f[r]);
                    f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(m, dx), f[r]);
                    continue;
                }
                const __m256i dot = _mm256_sub_epi32(_mm256_add_epi32(a0, a1), _mm256_set1_epi32(offset * c->sx[rb]));
                f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(c->dx[rb])), f[r]);
                if (mins) f[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(c->dsx[rb]), f[r]);
            }
        }
        const int here = lanes - 8 * half < 8 ? lanes - 8 * half : 8;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(here), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int r = 0; r < rt; r++)
            _mm256_maskstore_ps(c->y + (r0 + r) * c->y_stride + g * LANES + 8 * half, keep, f[r]);
    }
}

/* 1 where this CPU runs group512 (AVX-512 F, BW, VL and VNNI), else 0; typewriter_blocks_set_wide(0) keeps to
   group256 (tests). */
static int wide = -1;

int typewriter_blocks_wide(void) {
    if (wide < 0) {
        __builtin_cpu_init();
        wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    return wide;
}

void typewriter_blocks_set_wide(int on) {
    wide = -1;
    if (on) typewriter_blocks_wide();
    else wide = 0;
}

/* A row tile of each size for one format (a constant here, so each is compiled without the others' work). */
static inline __attribute__((always_inline)) VNNI void tiles512(const Call *c, int64_t g, const int format) {
    int r0 = 0;
    for (; r0 + ROW_TILE <= c->rows; r0 += ROW_TILE) group512(c, g, r0, ROW_TILE, format);
    switch (c->rows - r0) {
        case 1: group512(c, g, r0, 1, format); break;
        case 2: group512(c, g, r0, 2, format); break;
        case 3: group512(c, g, r0, 3, format); break;
#if ROW_TILE > 4
        case 4: group512(c, g, r0, 4, format); break;
        case 5: group512(c, g, r0, 5, format); break;
#endif
        default: break;
    }
}

static VNNI void group_wide(const Call *c, int64_t g) {
    switch (c->format) {
        case Q4: tiles512(c, g, Q4); break;
        case Q4M: tiles512(c, g, Q4M); break;
        case Q4K: tiles512(c, g, Q4K); break;
        case Q5: tiles512(c, g, Q5); break;
        case Q5M: tiles512(c, g, Q5M); break;
        case Q6K: tiles512(c, g, Q6K); break;
        default: tiles512(c, g, Q8); break;
    }
}

static void group_narrow(const Call *c, int64_t g) {
    for (int r0 = 0; r0 < c->rows; r0 += ROW_TILE256) c->rows - r0 == 1 ? group256(c, g, r0, 1) : group256(c, g, r0, 2);
}

/* The helper takes its groups from the front, the caller from the back: each thread reads one run of the weights
   in order, and the bytes each asks the cache for ahead (PREFETCH) are its own next ones, not its neighbour's, as
   when the two took alternate chunks (docs/measurements/2026-12-06-two-runs.md). `next` counts the groups both have
   taken, so they never take the same one. Each take is a quarter of what was left when the thread last looked, at
   least LEAST_TAKE: few atomic adds on a line both cores write (each a full barrier), and small takes at the end,
   where the two meet (docs/measurements/2026-12-07-zen5.md). */
static void work(Job *j, int from_front) {
    const int64_t groups = j->first[j->parts];
    const int use_wide = typewriter_blocks_wide();
    for (int64_t mine = 0, seen = 0;;) { /* mine: groups taken from this thread's end; seen: `next` after them */
        int64_t take = (groups - seen) / 4 > LEAST_TAKE ? (groups - seen) / 4 : LEAST_TAKE;
        const int64_t before = atomic_fetch_add_explicit(&j->next, take, memory_order_relaxed);
        if (before >= groups) break;
        take = take < groups - before ? take : groups - before;
        const int64_t first = from_front ? mine : groups - mine - take;
        for (int64_t g = first, p = 0; g < first + take; g++) {
            while (g >= j->first[p + 1]) p++;
            use_wide ? group_wide(&j->part[p], g - j->first[p]) : group_narrow(&j->part[p], g - j->first[p]);
        }
        mine += take, seen = before + take;
    }
}

/* ---- the next job's weights, warmed ----
   Between two jobs the caller works alone (its larger share of attention's groups, the norms, quantizing the next
   rows) and the memory idles. The helper, done with its share first, asks the cache for the weights the next job
   reads, from their front (where its own share of that job starts), until the job is posted or WARM_BYTES are
   asked for (docs/measurements/2026-12-07-zen5.md). typewriter_blocks_layers names the next job's weights before each
   job it posts; other callers name none. */
#define WARM_BYTES (256 * 1024)


static _Thread_local Warm next_warm;

static Job *_Atomic posted;

static void warm_until_posted(Warm w) {
    for (int64_t b = 0; b < w.bytes && !atomic_load_explicit(&posted, memory_order_relaxed); b += 1024)
        for (int64_t line = b; line < b + 1024 && line < w.bytes; line += 64)
            _mm_prefetch((const char *)(w.at + line), _MM_HINT_T1);
}

/* ---- one helper thread, as attention.c's: it spins a little after a call, then sleeps ---- */

static _Atomic int sleeping, helper_state; /* helper_state: 0 none, 1 running, -1 could not start */
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
        Job *job = atomic_exchange(&posted, NULL);
        if (job) {
            const Warm warm = job->warm; /* read before `left`: the job is gone once the caller sees it */
            job->task ? job->task(job->arg) : work(job, 1);
            atomic_store_explicit(&job->left, 1, memory_order_release);
            warm_until_posted(warm);
        }
    }
    return NULL;
}

static void forked(void) { /* a forked child has no helper: it starts its own when it needs one */
    atomic_store(&posted, NULL), atomic_store(&sleeping, 0), atomic_store(&helper_state, 0);
    pthread_mutex_init(&lock, NULL), pthread_cond_init(&wake, NULL); /* as the fork found them: maybe held */
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
            if (ok) pthread_atfork(NULL, NULL, forked);
            atomic_store(&helper_state, ok ? 1 : -1);
        }
        pthread_mutex_unlock(&lock);
    }
    return atomic_load(&helper_state) == 1;
}

/* `job` handed to the helper, woken if it sleeps; the caller works beside it, then `join`s. */
static void post(Job *job) {
    atomic_store(&posted, job);
    if (atomic_load(&sleeping)) {
        pthread_mutex_lock(&lock);
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&lock);
    }
}

/* Once the caller's share of a posted job is done: the job back if the helper never took it, else its end awaited. */
static void join(Job *job) {
    if (atomic_exchange(&posted, NULL) == NULL) /* the helper took it: wait for its last group */
        for (int spin = 0; !atomic_load_explicit(&job->left, memory_order_acquire); spin++)
            spin < SPIN ? _mm_pause() : (void)sched_yield();
}

/* Scratch a matmul of `rows` rows of `in` inputs needs: the quantized rows, then their scales, sums, products and
   first halves' sums. */
static size_t scratch_bytes(int rows, int64_t in) {
    return (size_t)((rows * in + 63) & ~(int64_t)63) + (size_t)rows * (in / BLOCK) * 16;
}

/* One matrix of a job: its weights, and where its outputs go (rows `y_stride` floats apart). */
typedef struct {
    const uint8_t *packed;
    int64_t out;
    int format;
    float *y;
    int64_t y_stride;
} Target;

/* Each target's y [rows, out] = x [rows, in] (rows `x_stride` apart) @ its W, in one job. */
static void matmuls(const Target *t, int parts, const float *x, int64_t x_stride, int rows, int64_t in,
                    void *scratch, int threads) {
    int8_t *xq = scratch;
    float *dx = (float *)(xq + ((rows * in + 63) & ~(int64_t)63));
    int32_t *sx = (int32_t *)(dx + rows * (in / BLOCK));
    float *dsx = (float *)(sx + rows * (in / BLOCK));
    int32_t *sxl = (int32_t *)(dsx + rows * (in / BLOCK));
    quantize_rows(x, rows, in, x_stride, xq, dx, sx, dsx, sxl);
    Job job = {.parts = parts, .warm = next_warm};
    for (int p = 0; p < parts; p++) {
        job.part[p] = (Call){t[p].packed, xq, dx, sx, dsx, sxl, t[p].y, in, t[p].out, t[p].y_stride, rows, t[p].format};
        job.first[p + 1] = job.first[p] + (t[p].out + LANES - 1) / LANES;
    }
    const int helped = threads > 1 && job.first[parts] > LEAST_TAKE && helper_running();
    if (helped) post(&job);
    work(&job, 0);
    if (helped) join(&job);
}

/* attention.c's groups of a layer's call, `mine` by the caller and `theirs` by this helper, which spins between the
   layer's matmuls: a decode row's few groups are shared without waking a thread, where attention.c's own helper
   shares only calls of SPLIT_WORK positions and more (docs/measurements/2026-12-06-late-tokenizer.md). */
static void share(void (*mine)(void *), void (*theirs)(void *), void *arg) {
    Job job = {.task = theirs, .arg = arg, .warm = next_warm};
    const int helped = helper_running();
    if (helped) post(&job);
    mine(arg);
    if (helped) join(&job);
}

/* y [rows, out] (rows `y_stride` floats apart) = x [rows, in] (rows `x_stride` apart) @ W. */
static void matmul(const uint8_t *packed, const float *x, int64_t x_stride, int rows, int64_t in, int64_t out,
                   int format, float *y, int64_t y_stride, void *scratch, int threads) {
    const Target target = {packed, out, format, y, y_stride};
    matmuls(&target, 1, x, x_stride, rows, in, scratch, threads);
}

/* One matmul alone (blocks.py's tests and measurements): y [rows, out] = x [rows, in] @ W. Returns 0, or -2 when
   out of memory. */
int typewriter_blocks_matmul(const uint8_t *packed, const float *x, int rows, int64_t in, int64_t out, int format,
                             float *y, int threads) {
    void *scratch = malloc(scratch_bytes(rows, in));
    if (!scratch) return -2;
    matmul(packed, x, in, rows, in, out, format, y, out, scratch, threads);
    free(scratch);
    return 0;
}

/* ---- a whole model's layers ---- */

typedef struct {
    const uint8_t *packed;
    int64_t in, out, format;
} Matrix;

typedef struct {
    const float *attention_norm, *ffn_norm; /* [dim] */
    const float *bias;                      /* q, k and v's biases [(h + 2k) e], or NULL */
    Matrix q, k, v, o, gate, up, down;
    uint16_t *keys, *values; /* this layer's caches, as attention.c lays them out */
} Layer;

typedef struct {
    int64_t n_layers, dim, heads, kv_heads, head_dim, hidden;
    int64_t v_block; /* V is cached rotated by a Hadamard inside blocks of this many channels (runners/lite/layers.py) */
    float eps;
    const Layer *layers;
    const float *cos, *sin; /* RoPE's angles [angles, head_dim / 2] */
    int64_t angles, slot_count, stride;
    const float *norm; /* the final norm [dim] and the logits' matrix */
    Matrix output;
} Model;

/* The next job's weights, for the helper to warm: the matrix from its front, at most WARM_BYTES (whole or half
   of a small one measured alike). */
static void warm_next(const Matrix *w) {
    const int64_t bytes = typewriter_blocks_bytes(w->in, w->out, (int)w->format);
    next_warm = (Warm){w->packed, bytes < WARM_BYTES ? bytes : WARM_BYTES};
}

void typewriter_attention_share(void (*share)(void (*)(void *), void (*)(void *), void *));
int typewriter_layer(const float *qkv, const int64_t *slots, const int64_t *positions, int t, int h, int k, int e,
                     const float *cos, const float *sin, int64_t angles, float scale, uint16_t *keys,
                     uint16_t *values, int64_t slot_count, int64_t stride, float *q, float *out, int threads);

/* The squares summed in double, in 16 running sums (4 vectors of 4) then added in a fixed order: a single running
   sum was a chain of one addition after another, about 2,300 cycles a norm on the 135M's 576 channels. */
static void rms_norm(const float *x, const float *g, int rows, int64_t n, float eps, float *y) {
    for (int r = 0; r < rows; r++) {
        const float *v = x + r * n;
        __m256d sums[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int k = 0; k < 4; k++) {
                const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(v + i + 4 * k));
                sums[k] = _mm256_fmadd_pd(d, d, sums[k]);
            }
        double lanes[4];
        _mm256_storeu_pd(lanes, _mm256_add_pd(_mm256_add_pd(sums[0], sums[1]), _mm256_add_pd(sums[2], sums[3])));
        double squares = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
        for (; i < n; i++) squares += (double)v[i] * v[i];
        const float inv = (float)(1.0 / sqrt(squares / (double)n + eps));
        for (int64_t i = 0; i < n; i++) y[r * n + i] = v[i] * inv * g[i];
    }
}

/* x @ H inside each block of b channels (H the normalized Sylvester Hadamard, its own inverse), in place. */
static void hadamard(float *x, int64_t n, int64_t b) {
    const float scale = (float)(1.0 / sqrt((double)b));
    for (int64_t at = 0; at < n; at += b) {
        float *v = x + at;
        for (int64_t h = 1; h < b; h *= 2)
            for (int64_t i = 0; i < b; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const float a = v[j], c = v[j + h];
                    v[j] = a + c, v[j + h] = a - c;
                }
        for (int64_t i = 0; i < b; i++) v[i] *= scale;
    }
}

/* exp(x) for every lane, as attention.c's (Cephes' expf, about 2 ulp), x held within -87..88 so 2^m stays a
   float: SiLU meets both ends. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
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

/* SiLU(gate) * up, into gate. */
static void silu_times(float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* Every layer for t rows: x [t, dim] (the residual stream, updated in place), row i slot slots[i]'s token at
   positions[i], its K and V written into each layer's caches. Returns 0, attention.c's -1 or -3 (for the first
   layer: nothing written then), or -2 when out of memory. */
int typewriter_blocks_layers(const Model *m, float *x, int t, const int64_t *slots, const int64_t *positions,
                             int threads) {
    const int64_t d = m->dim, h = m->heads, k = m->kv_heads, e = m->head_dim, f = m->hidden;
    const int64_t width = (h + 2 * k) * e, widest = f > d ? (f > h * e ? f : h * e) : (d > h * e ? d : h * e);
    const size_t floats = (size_t)t * (d + width + h * e + h * e + 2 * f + d);
    float *memory = malloc(floats * sizeof(float) + scratch_bytes(t, widest));
    if (!memory) return -2;
    float *normed = memory, *qkv = normed + t * d, *q = qkv + t * width, *attended = q + t * h * e;
    float *gate = attended + t * h * e, *up = gate + t * f, *added = up + t * f;
    void *scratch = added + t * d;
    int status = 0;
    typewriter_attention_share(threads > 1 ? share : NULL);
    for (int64_t i = 0; i < m->n_layers && !status; i++) {
        const Layer *L = m->layers + i;
        rms_norm(x, L->attention_norm, t, d, m->eps, normed);
        const Target qkv_of[3] = {{L->q.packed, L->q.out, (int)L->q.format, qkv, width},
                                  {L->k.packed, L->k.out, (int)L->k.format, qkv + h * e, width},
                                  {L->v.packed, L->v.out, (int)L->v.format, qkv + (h + k) * e, width}};
        warm_next(&L->o);
        matmuls(qkv_of, 3, normed, d, t, d, scratch, threads);
        for (int r = 0; r < t; r++) {
            if (L->bias) add_into(qkv + r * width, L->bias, width);
            if (m->v_block) hadamard(qkv + r * width + (h + k) * e, k * e, m->v_block);
        }
        status = typewriter_layer(qkv, slots, positions, t, (int)h, (int)k, (int)e, m->cos, m->sin, m->angles,
                                  1.0f / sqrtf((float)e), L->keys, L->values, m->slot_count, m->stride, q, attended,
                                  threads);
        if (status) break;
        if (m->v_block)
            for (int r = 0; r < t; r++) hadamard(attended + r * h * e, h * e, m->v_block);
        warm_next(&L->gate);
        matmul(L->o.packed, attended, h * e, t, h * e, d, (int)L->o.format, added, d, scratch, threads);
        add_into(x, added, t * d);
        rms_norm(x, L->ffn_norm, t, d, m->eps, normed);
        const Target gate_up[2] = {{L->gate.packed, f, (int)L->gate.format, gate, f},
                                   {L->up.packed, f, (int)L->up.format, up, f}};
        warm_next(&L->down);
        matmuls(gate_up, 2, normed, d, t, d, scratch, threads);
        silu_times(gate, up, t * f);
        warm_next(i + 1 < m->n_layers ? &m->layers[i + 1].q : &m->output);
        matmul(L->down.packed, gate, f, t, f, d, (int)L->down.format, added, d, scratch, threads);
        add_into(x, added, t * d);
    }
    typewriter_attention_share(NULL);
    next_warm = (Warm){NULL, 0};
    free(memory);
    return status;
}

/* The final norm and the logits: x [t, dim] -> out [t, vocab]. Returns 0, or -2 when out of memory. */
int typewriter_blocks_logits(const Model *m, const float *x, int t, float *out, int threads) {
    const int64_t d = m->dim;
    float *normed = malloc((size_t)t * d * sizeof(float) + scratch_bytes(t, d));
    if (!normed) return -2;
    rms_norm(x, m->norm, t, d, m->eps, normed);
    matmul(m->output.packed, normed, d, t, d, m->output.out, (int)m->output.format, out, m->output.out,
           normed + t * d, threads);
    free(normed);
    return 0;
}
