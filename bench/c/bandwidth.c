/* STREAM-like loops for bench/bandwidth.py: read a buffer (a sum over 64-byte lines, so nothing is skipped) or copy
 * it, split evenly between `threads` threads (the caller's and threads - 1 pthreads), timed from the first thread's
 * start to the last one's end. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
  const uint8_t *src;
  uint8_t *dst;
  size_t bytes;
  int copy;
  uint64_t sink;
} part_t;

static void *run_part(void *arg) {
  part_t *p = arg;
  if (p->copy) {
    memcpy(p->dst, p->src, p->bytes);
    return NULL;
  }
  const __m256i *s = (const __m256i *)p->src;
  size_t n = p->bytes / 32;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { /* four accumulators: the adds never wait on each other */
    a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_loadu_si256(s + i), _mm256_loadu_si256(s + i + 1)));
    a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_loadu_si256(s + i + 2), _mm256_loadu_si256(s + i + 3)));
    a2 = _mm256_add_epi64(a2, _mm256_add_epi64(_mm256_loadu_si256(s + i + 4), _mm256_loadu_si256(s + i + 5)));
    a3 = _mm256_add_epi64(a3, _mm256_add_epi64(_mm256_loadu_si256(s + i + 6), _mm256_loadu_si256(s + i + 7)));
  }
  __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t lanes[4];
  _mm256_storeu_si256((__m256i *)lanes, a);
  p->sink = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  return NULL;
}

/* Seconds one pass took; `bytes` a multiple of 256 * threads. */
double bandwidth_pass(const void *src, void *dst, int64_t bytes, int threads, int copy, uint64_t *sink) {
  part_t parts[16];
  pthread_t ids[16];
  if (threads < 1) threads = 1;
  if (threads > 16) threads = 16;
  size_t each = (size_t)bytes / threads;
  for (int t = 0; t < threads; t++)
    parts[t] = (part_t){(const uint8_t *)src + t * each, dst ? (uint8_t *)dst + t * each : NULL, each, copy, 0};
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int t = 1; t < threads; t++) pthread_create(&ids[t], NULL, run_part, &parts[t]);
  run_part(&parts[0]);
  for (int t = 1; t < threads; t++) pthread_join(ids[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  uint64_t total = 0;
  for (int t = 0; t < threads; t++) total += parts[t].sink;
  *sink = total;
  return (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}
