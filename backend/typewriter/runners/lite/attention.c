/* Attention over the host K/V cache for int8-lite: attention.py's kernel, built and loaded by kernel.py.

   One routine computes every query row, a decode row or a prompt-chunk row alike, from that row and its slot's
   cache alone, each in a fixed order: a score adds its e products in order, a row's maximum and sum go through
   8 lanes (position j in lane j % 8) and then a fixed tree, and the values add position after position. So a
   token's output is the same bits whether it is decoded, prefilled in a chunk of any size at any start, or
   batched with other rows, and a greedy answer cannot depend on how the scheduler cut a prompt or what it reused.

   The cache holds float16 (half the bytes to read: a decode row at 1,400 positions reads 1 MB a layer), converted
   with F16C. AVX2, FMA and F16C: every x86-64 machine this runs on (Intel since Haswell, AMD since Zen). Where the
   CPU has AVX-512 the same routine runs 16 lanes wide and 8 rows at a time (rows512): every lane does the same
   operations in the same order as in the 8-lane routine (a tile's 16 scores are its two 8-lane halves, the sum
   still adds 8 lanes at a time), so both give the same bits, and a machine's answers do not depend on which ran.

   A call with enough work shares its groups of rows with one helper thread (the matmuls' second core is idle while
   attention runs): either thread computes a group the same way, so sharing changes the time, not the bits. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define W 8      /* floats in a vector */
#define TILE 16  /* positions a score tile holds: two vectors */
#define ROWS 4   /* query rows computed together, so a key or value is loaded once for all of them */
#define ROWS512 8  /* the same with AVX-512's 32 registers: 8 rows share a key tile */
/* Rows times the positions each reads, in all, from which a call shares its groups with a helper thread. Large
   calls (a prompt chunk or a batch of decode rows at long contexts) gain the second core; small ones gain little,
   and each hand-off risks the helper being preempted while the caller waits for its group. The step times and the
   bench/stall.py runs behind this value: docs/measurements/2026-12-04-int8-lite-two-thread-attention.md. */
#define SPLIT_WORK 32768
#define WIDE __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

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

/* ---- the same routine 16 lanes wide (AVX-512), for CPUs that have it ---- */

#define ALWAYS __attribute__((always_inline))

/* exp8's operations on 16 lanes: each lane gets exp8's bits. */
WIDE static inline ALWAYS __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 m = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(m, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(m, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i two = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(m), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(two));
}

/* R rows' scores over `tiles` tiles of keys: a lane is a position, its channels added in order, as in `rows`. */
WIDE static inline ALWAYS void score512(const float *const *row, const int R, const uint16_t *restrict keys, int tiles,
                                        int e, float *restrict scores, int padded) {
    for (int j0 = 0; j0 < tiles * TILE; j0 += TILE) {
        __m512 acc[ROWS512];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        const uint16_t *tile = keys + (int64_t)j0 * e;
        for (int c = 0; c < e; c++) {
            const __m512 kc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + c * TILE)));
            for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(row[r][c]), kc, acc[r]);
        }
        for (int r = 0; r < R; r++) _mm512_storeu_ps(scores + (int64_t)r * padded + j0, acc[r]);
    }
}

/* One row's scores s [tiles * TILE] -> its softmax numerators in place (0 past position n), and 1 / their sum.
   The sum adds 8 lanes at a time in position order, as `rows` does: a 16-lane vector is its low half, then its
   high half. */
WIDE static float softmax512(float *restrict s, int n, int tiles) {
    const int whole = (n + W - 1) / W * W;
    for (int j = n; j < whole; j++) s[j] = -INFINITY;
    __m512 top16 = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 2 * W <= whole; j += 2 * W) top16 = _mm512_max_ps(top16, _mm512_loadu_ps(s + j));
    __m256 top = _mm256_max_ps(_mm512_castps512_ps256(top16), _mm512_extractf32x8_ps(top16, 1));
    if (j < whole) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
    const float peak = lanes_max(top);
    const __m512 peak16 = _mm512_set1_ps(peak);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j + 2 * W <= whole; j += 2 * W) {
        const __m512 x = _mm512_loadu_ps(s + j);
        const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
        const __m512 e16 = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(x, peak16)));
        _mm512_storeu_ps(s + j, e16);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e16));
        sum = _mm256_add_ps(sum, _mm512_extractf32x8_ps(e16, 1));
    }
    if (j < whole) {
        const __m256 x = _mm256_loadu_ps(s + j);
        __m256 e8 = exp8(_mm256_sub_ps(x, _mm256_set1_ps(peak)));
        e8 = _mm256_blendv_ps(e8, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
        _mm256_storeu_ps(s + j, e8);
        sum = _mm256_add_ps(sum, e8);
    }
    for (j = whole; j < tiles * TILE; j++) s[j] = 0.0f;
    return 1.0f / lanes_sum(sum);
}

/* R (1..4) rows' outputs, channels c0 .. c0 + 16 NV: the values weighted position after position, as in `rows`. */
WIDE static inline ALWAYS void weigh512(const float *const *s, const int R, const int NV, const uint16_t *restrict values,
                                        int most, int e, int c0, const float *inverse, float *const *out) {
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NV; b++) acc[r][b] = _mm512_setzero_ps();
    for (int j = 0; j < most; j++) {
        __m512 v[4];
        for (int b = 0; b < NV; b++)
            v[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(values + (int64_t)j * e + c0 + b * TILE)));
        for (int r = 0; r < R; r++) {
            const __m512 w = _mm512_set1_ps(s[r][j]);
            for (int b = 0; b < NV; b++) acc[r][b] = _mm512_fmadd_ps(w, v[b], acc[r][b]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NV; b++)
            _mm512_storeu_ps(out[r] + c0 + b * TILE, _mm512_mul_ps(acc[r][b], _mm512_set1_ps(inverse[r])));
}

#define EACH_1_TO_4(F, X, ...) \
    switch (X) { case 1: F(__VA_ARGS__, 1); break; case 2: F(__VA_ARGS__, 2); break; \
                 case 3: F(__VA_ARGS__, 3); break; default: F(__VA_ARGS__, 4); break; }
#define WEIGH(R, NV) weigh512(s + r0, R, NV, values, most, e, c0, inverse + r0, out + r0)
#define WEIGH_R(R, NV) EACH_1_TO_4(WEIGH, NV, R)
#define SCORE(R) score512(row, R, keys, tiles, e, scores, padded)

/* `rows` with AVX-512: count (1..ROWS512) rows. */
WIDE static void rows512(const float *const *q, const int *n, int count, const uint16_t *restrict keys, int padded,
                         const uint16_t *restrict values, int e, float *restrict scores, float *const *out) {
    const float *row[ROWS512];
    const float *s[ROWS512];
    float inverse[ROWS512];
    int most = 0;
    for (int r = 0; r < count; r++) {
        row[r] = q[r], s[r] = scores + (int64_t)r * padded;
        most = n[r] > most ? n[r] : most;
    }
    const int tiles = (most + TILE - 1) / TILE;
    switch (count) {
        case 1: SCORE(1); break; case 2: SCORE(2); break; case 3: SCORE(3); break; case 4: SCORE(4); break;
        case 5: SCORE(5); break; case 6: SCORE(6); break; case 7: SCORE(7); break; default: SCORE(8); break;
    }
    for (int r = 0; r < count; r++) inverse[r] = softmax512(scores + (int64_t)r * padded, n[r], tiles);
    for (int r0 = 0; r0 < count; r0 += 4) {
        const int rest = count - r0 < 4 ? count - r0 : 4;
        for (int c0 = 0; c0 < e; c0 += 4 * TILE) {
            const int vectors = (e - c0) / TILE < 4 ? (e - c0) / TILE : 4;
            switch (rest) {
                case 1: WEIGH_R(1, vectors); break; case 2: WEIGH_R(2, vectors); break;
                case 3: WEIGH_R(3, vectors); break; default: WEIGH_R(4, vectors); break;
            }
        }
    }
}

/* 1 where this CPU runs rows512 (AVX-512 F, BW, DQ, VL), else 0; typewriter_set_wide(0) keeps to `rows` (tests). */
static int wide = -1;

int typewriter_wide(void) {
    if (wide < 0) {
        __builtin_cpu_init();
        wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    }
    return wide;
}

void typewriter_set_wide(int on) {
    wide = -1;
    if (on) typewriter_wide();
    else wide = 0;
}

/* Whether every slot is below `slot_count` and every position below `positions_below` (both at least 0). */
static int inside(const int64_t *slots, const int64_t *positions, int t, int64_t slot_count, int64_t positions_below) {
    for (int i = 0; i < t; i++)
        if (slots[i] < 0 || slots[i] >= slot_count || positions[i] < 0 || positions[i] >= positions_below) return 0;
    return 1;
}

/* ---- a call's work: groups of rows, each computed alone (so by either thread, the same bits) ---- */

typedef void (*Compute)(const float *const *, const int *, int, const uint16_t *, int, const uint16_t *, int,
                        float *, float *const *);

typedef struct {
    int64_t cache;  /* offset of its slot's and head's keys and values */
    int first, count;  /* its rows in the call's row lists */
} Group;

typedef struct {
    Compute compute;
    const Group *groups;
    int count, padded, e;
    const float *const *q;
    float *const *out;
    const int *n;
    const uint16_t *keys, *values;
    float *scratch[2];  /* ROWS512 * padded floats each: the caller's, the helper's */
    _Atomic int next;  /* the next group to take */
    _Atomic int left;  /* 1 once the helper, having taken this call, has finished with it */
} Call;

/* Returns the groups it computed. */
static int work(Call *call, float *scratch) {
    int done = 0;
    for (int i; (i = atomic_fetch_add_explicit(&call->next, 1, memory_order_relaxed)) < call->count; done++) {
        const Group *g = call->groups + i;
        call->compute(call->q + g->first, call->n + g->first, g->count, call->keys + g->cache, call->padded,
                      call->values + g->cache, call->e, scratch, call->out + g->first);
    }
    return done;
}

/* ---- one helper thread, started on first use: it takes a posted call and computes groups beside the caller.
   It waits a little spinning (the next layer's call comes within a millisecond), then asleep, so that it takes
   no core from the matmuls between calls for long. ---- */

#define SPIN 200  /* pauses before it sleeps: a few microseconds */

static int64_t split_work = SPLIT_WORK;

/* For tests and measurements; below 0: SPLIT_WORK again. */
void typewriter_set_split_work(int64_t rows_positions) {
    split_work = rows_positions < 0 ? SPLIT_WORK : rows_positions;
}

static Call *_Atomic posted;
static _Atomic int sleeping, helper_state;  /* helper_state: 0 none, 1 running, -1 could not start */
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
        Call *call = atomic_exchange(&posted, NULL);  /* NULL: the caller finished it alone and took it back */
        if (call) {
            work(call, call->scratch[1]);
            atomic_store_explicit(&call->left, 1, memory_order_release);  /* its last touch of the call */
        }
    }
    return NULL;
}

static void forked(void) {  /* a forked child has no helper: it starts its own when it needs one */
    atomic_store(&posted, NULL), atomic_store(&sleeping, 0), atomic_store(&helper_state, 0);
    pthread_mutex_init(&lock, NULL), pthread_cond_init(&wake, NULL);
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

/* Another thread's way to share a call's groups, set by the calling thread for its own calls only (blocks.c's layers:
   its helper spins between their matmuls); int8-lite's calls keep to this file's helper. share(mine, theirs, call)
   runs mine(call) here and theirs(call) on the other thread, returning once both are done. */
typedef void (*Task)(void *);
static _Thread_local void (*sharer)(Task, Task, void *);

void typewriter_attention_share(void (*share)(Task, Task, void *)) { sharer = share; }

static _Atomic int64_t shared_groups;  /* computed by a sharer's thread, since the library was loaded (tests) */

int64_t typewriter_attention_shared_groups(void) { return atomic_load(&shared_groups); }

static void mine(void *call) { work(call, ((Call *)call)->scratch[0]); }
static void theirs(void *call) { atomic_fetch_add(&shared_groups, work(call, ((Call *)call)->scratch[1])); }

/* The call's groups by the caller, and by the helper too when `helped`; returns once every group is done. */
static void run(Call *call, int helped) {
    if (helped) {
        atomic_store(&posted, call);
        if (atomic_load(&sleeping)) {
            pthread_mutex_lock(&lock);
            pthread_cond_signal(&wake);
            pthread_mutex_unlock(&lock);
        }
    }
    work(call, call->scratch[0]);
    if (helped && atomic_exchange(&posted, NULL) == NULL)  /* the helper took it: wait for its last group, */
        for (int spin = 0; !atomic_load_explicit(&call->left, memory_order_acquire); spin++)
            spin < SPIN ? _mm_pause() : (void)sched_yield();  /* giving up the core if the helper needs it */
}

/* q and out [t, k, g, e] (q RoPE'd and scaled); keys [slots, k, stride / TILE, e, TILE] and values
   [slots, k, stride, e]; row (i, h, r) is slot slots[i]'s token at positions[i], attending to that slot's positions
   0..positions[i]. Consecutive rows of one slot and head (a prompt chunk's, or a decode row's g) are computed
   ROWS (ROWS512) at a time, a group; with `threads` 2 and at least SPLIT_WORK positions to read in all, a helper
   thread computes groups beside the caller's (with `threads` 2 and a sharer set by this thread, whatever the size,
   the sharer's thread does). Returns 0, -1 for a head size that is not a multiple of TILE, -2
   when out of memory, -3 for a slot or position outside the cache (nothing written then). */
int typewriter_attend(const float *q, const int64_t *slots, const int64_t *positions, int t, int k, int g, int e,
                      const uint16_t *keys, const uint16_t *values, int64_t slot_count, int64_t stride, float *out,
                      int threads) {
    if (e % TILE) return -1;
    if (!inside(slots, positions, t, slot_count, stride)) return -3;
    const int group_rows = typewriter_wide() ? ROWS512 : ROWS, total = t * k * g;
    int most = 0;
    int64_t reads = 0;
    for (int i = 0; i < t; i++) {
        most = (int)positions[i] + 1 > most ? (int)positions[i] + 1 : most;
        reads += positions[i] + 1;
    }
    const int padded = (most + TILE - 1) / TILE * TILE;
    const int shared = threads > 1 && sharer != NULL;
    const int helped = threads > 1 && !shared && reads * k * g >= split_work && helper_running();
    void *memory = malloc(sizeof(float) * ROWS512 * (size_t)padded * (helped || shared ? 2 : 1) +
                          (sizeof(float *) * 2 + sizeof(int) + sizeof(Group)) * (size_t)total);
    if (!memory) return -2;
    float *scratch = memory;
    const float **qs = (const float **)(scratch + (size_t)ROWS512 * padded * (helped || shared ? 2 : 1));
    float **outs = (float **)(qs + total);
    Group *groups = (Group *)(outs + total);
    int *n = (int *)(groups + total);
    const int64_t head = stride * e, slot = k * head;
    int row = 0, count = 0;
    for (int h = 0; h < k; h++)
        for (int i = 0; i < t; i++)
            for (int r = 0; r < g; r++, row++) {
                const int64_t at = (((int64_t)i * k + h) * g + r) * e, cache = slots[i] * slot + h * head;
                qs[row] = q + at, outs[row] = out + at, n[row] = (int)positions[i] + 1;
                if (!count || groups[count - 1].count == group_rows || groups[count - 1].cache != cache)
                    groups[count++] = (Group){cache, row, 0};  /* full, or another slot's or head's cache */
                groups[count - 1].count++;
            }
    Call call = {typewriter_wide() ? rows512 : rows, groups, count, padded, e, qs, outs, n, keys, values,
                 {scratch, scratch + (size_t)ROWS512 * padded}, 0, 0};
    if (shared && count > 1)
        sharer(mine, theirs, &call);
    else
        run(&call, helped && count > 1);
    free(memory);
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

/* typewriter_write, then typewriter_attend over the rows just written: one call a layer (q: [t, h, e] scratch). */
int typewriter_layer(const float *qkv, const int64_t *slots, const int64_t *positions, int t, int h, int k, int e,
                     const float *cos, const float *sin, int64_t angles, float scale, uint16_t *keys,
                     uint16_t *values, int64_t slot_count, int64_t stride, float *q, float *out, int threads) {
    const int status = typewriter_write(qkv, slots, positions, t, h, k, e, cos, sin, angles, scale, keys, values,
                                        slot_count, stride, q);
    return status ? status : typewriter_attend(q, slots, positions, t, k, h / k, e, keys, values, slot_count, stride,
                                               out, threads);
}
