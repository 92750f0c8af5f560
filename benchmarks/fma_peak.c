/* The machine's float32 FMA peak: a register-only loop, no memory traffic.

   benchmarks/gemm.py builds it as a shared library (gcc -O3 -march=native -pthread -shared
   -fPIC) and calls fma_peak_seconds() in alternation with the GEMMs it measures, so that the
   peak and the GEMM see the same load of a shared machine. As a program:

       gcc -O3 -march=native -pthread -o fma_peak benchmarks/fma_peak.c
       ./fma_peak THREADS SECONDS

   Each thread runs independent chains of fused multiply-adds on vector registers (more chains
   than FMA pipes x FMA latency, so the pipes never wait for a result) and prints one line per
   vector width: "ymm GFLOPS" (AVX2 256-bit, 8 float32 lanes) and "zmm GFLOPS" (AVX-512, 16
   lanes; only on a CPU with avx512f). GFLOP/s counts 2 flops per lane per FMA, over all
   threads, divided by the slowest thread's wall time. */

#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHAINS 12     /* independent accumulators per thread */
#define INNER 1000    /* loop trips between clock reads */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

typedef struct {
  int wide;           /* 0: ymm, 1: zmm */
  double seconds;     /* how long to run (when trips is 0) */
  long long trips;    /* how many loop trips to run (0: for `seconds`) */
  double elapsed;     /* out: wall time */
  long long fmas;     /* out: vector FMAs done */
  float sink;         /* out: keeps the result live */
  pthread_barrier_t* start;
} job_t;

/* Each step: acc[i] = acc[i] * m + a, CHAINS chains. m is just below 1 and a tiny, so the
   values stay finite forever. Macros repeat the chains without arrays so that every
   accumulator is its own register. */
#define CHAIN_OPS(FMA, X)                                                          \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

static void* run_ymm(job_t* job) {
  __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
#define DECL(i) __m256 acc##i = _mm256_set1_ps((float)(i));
  CHAIN_OPS(_, DECL)
#undef DECL
  pthread_barrier_wait(job->start);
  double t0 = now(), t;
  long long trips = 0;
  do {
    for (int r = 0; r < INNER; r++) {
#define STEP(i) acc##i = _mm256_fmadd_ps(acc##i, m, a);
      CHAIN_OPS(_, STEP)
#undef STEP
    }
    trips += INNER;
    t = now();
  } while (job->trips ? trips < job->trips : t - t0 < job->seconds);
  job->elapsed = t - t0;
  job->fmas = trips * CHAINS;
  __m256 s = _mm256_setzero_ps();
#define SUM(i) s = _mm256_add_ps(s, acc##i);
  CHAIN_OPS(_, SUM)
#undef SUM
  job->sink = _mm256_cvtss_f32(s);
  return NULL;
}

#ifdef __AVX512F__
static void* run_zmm(job_t* job) {
  __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
#define DECL(i) __m512 acc##i = _mm512_set1_ps((float)(i));
  CHAIN_OPS(_, DECL)
#undef DECL
  pthread_barrier_wait(job->start);
  double t0 = now(), t;
  long long trips = 0;
  do {
    for (int r = 0; r < INNER; r++) {
#define STEP(i) acc##i = _mm512_fmadd_ps(acc##i, m, a);
      CHAIN_OPS(_, STEP)
#undef STEP
    }
    trips += INNER;
    t = now();
  } while (job->trips ? trips < job->trips : t - t0 < job->seconds);
  job->elapsed = t - t0;
  job->fmas = trips * CHAINS;
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, acc##i);
  CHAIN_OPS(_, SUM)
#undef SUM
  job->sink = _mm512_reduce_add_ps(s);
  return NULL;
}
#endif

static void* worker(void* arg) {
  job_t* job = (job_t*)arg;
#ifdef __AVX512F__
  if (job->wide) return run_zmm(job);
#endif
  return run_ymm(job);
}

/* Run the loop on `threads` threads, each for `trips` trips (0: for `seconds`); returns the
   flops done over all threads (2 per lane per FMA) and stores the slowest thread's time. */
static double run(int wide, int threads, double seconds, long long trips, double* elapsed) {
  pthread_t tid[256];
  job_t jobs[256];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  for (int i = 0; i < threads; i++) {
    jobs[i] = (job_t){.wide = wide, .seconds = seconds, .trips = trips, .start = &start};
    pthread_create(&tid[i], NULL, worker, &jobs[i]);
  }
  double flops = 0, slowest = 0, sink = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(tid[i], NULL);
    flops += (double)jobs[i].fmas * (wide ? 16 : 8) * 2;
    if (jobs[i].elapsed > slowest) slowest = jobs[i].elapsed;
    sink += jobs[i].sink;
  }
  pthread_barrier_destroy(&start);
  if (sink != sink) fprintf(stderr, "nan\n"); /* never: keeps the chains live */
  *elapsed = slowest;
  return flops;
}

/* Flops of `trips` loop trips per thread (for a caller that times the call itself). */
double fma_peak_flops(int wide, int threads, long long trips) {
  return (double)trips * CHAINS * (wide ? 16 : 8) * 2 * threads;
}

/* Run `trips` trips on each of `threads` threads; the slowest thread's seconds. `wide` 1 is
   the AVX-512 loop (-1 returned where the CPU or the compiler has none). */
double fma_peak_seconds(int wide, int threads, long long trips) {
  double elapsed = 0;
#ifndef __AVX512F__
  if (wide) return -1;
#endif
  if (threads < 1 || threads > 256 || trips < INNER) return -1;
  run(wide, threads, 0, trips, &elapsed);
  return elapsed;
}

static double measure(int wide, int threads, double seconds) {
  double elapsed = 0, flops = run(wide, threads, seconds, 0, &elapsed);
  return flops / elapsed / 1e9;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  double seconds = argc > 2 ? atof(argv[2]) : 0.5;
  if (threads < 1 || threads > 256) {
    fprintf(stderr, "usage: fma_peak THREADS(1-256) SECONDS\n");
    return 2;
  }
  printf("ymm %.2f\n", measure(0, threads, seconds));
#ifdef __AVX512F__
  printf("zmm %.2f\n", measure(1, threads, seconds));
#endif
  return 0;
}
