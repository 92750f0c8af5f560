"""kiln's thread pool, in every generated library: how parallel loops run.

A parallel loop of a kernel calls ``kiln_parallel_for(task, ctx, n, threads)``: the loop's ``n``
iterations are cut into chunks (four per thread, as even as whole iterations allow: sizes differ
by at most one, the larger first), and the calling thread and up to
``threads - 1`` pool workers take chunks from one atomic counter until none is left; the call
returns when every chunk *taken* is finished. Even chunks matter where a loop has only a few
iterations per thread: 14 row blocks cut into chunks of ceil(14 / 8) = 2 made 7 chunks, 4 for
one thread and 3 for the other (ResNet-18's 56x56x64 3x3 convolutions took 1.12x onnxruntime's
time that way); cut into 8 chunks of 2 or 1 they split 7 / 7. This is what onnxruntime's pool
does, and it is
why a busy machine does not stall the model: with OpenMP (``#pragma omp parallel for``, static
schedule, an implicit barrier) every region waited for every thread of the team, and a worker
the scheduler had put aside for a competing process held up every kernel for a time slice --
while its partners spun against that process (libgomp spins 300,000 times before sleeping).
Here a worker that is not running takes no chunk and is not waited for; the caller does the
work.

Workers spin for ``KILN_POOL_SPIN_US`` microseconds (default 50) after their last chunk, with
``pause``, so the next kernel of a run finds them awake; then they sleep on a condition
variable, and leave after ``KILN_POOL_IDLE_S`` seconds (default 5) without work, so a process
holding many models keeps no idle threads (workers are named ``kiln-pool``). A caller waiting
for chunks still running spins briefly, then yields its CPU.

Thread count: ``kiln_set_num_threads(n)`` sets it for loops started from the calling thread
(``0``: back to the default); the default is ``KILN_NUM_THREADS``, else ``OMP_NUM_THREADS``,
else the CPUs the process may run on. A kernel built for a target with ``num_threads`` passes
that count instead. One pool serves a library: a loop started while another thread's loop
owns the pool runs on its own thread (concurrent calls then share the cores instead of
oversubscribing them). After ``fork()`` the child starts with no workers.
"""

from __future__ import annotations

#: Declarations every compilation unit of a generated file sees (part of its prelude).
DECLARATIONS = r"""
/* ---- kiln's thread pool (defined once, KILN_POOL_SOURCE; see kiln/codegen/c/thread_pool.py) */
typedef void (*kiln_task_fn)(void* ctx, int64_t begin, int64_t end);
/* Run task(ctx, begin, end) over [0, n) in chunks on up to `threads` threads (0: the caller's
   setting); returns when every chunk is done. */
__attribute__((visibility("hidden"))) void kiln_parallel_for(kiln_task_fn task, void* ctx,
                                                             int64_t n, int32_t threads);
void kiln_set_num_threads(int32_t n);
int32_t kiln_get_max_threads(void);
"""

#: The pool's definitions: a compilation unit of its own.
SOURCE = r"""/* ---- kiln's thread pool (see kiln/codegen/c/thread_pool.py) ---- */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define KILN_POOL_MAX 256          /* workers at most */
#define KILN_SEQ_BITS 24           /* job numbers live in the claim word's top bits */
#define KILN_IDX_BITS 40
#define KILN_IDX_MASK ((UINT64_C(1) << KILN_IDX_BITS) - 1)

static inline void kiln_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static double kiln_pool_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
  pthread_mutex_t lock;       /* sleeping workers, starting and leaving workers */
  pthread_cond_t wake;
  pthread_mutex_t busy;       /* held by the caller whose loop owns the pool */
  _Atomic uint64_t claim;     /* (job << KILN_IDX_BITS) | next chunk to take */
  _Atomic int64_t done;       /* chunks of the current job finished */
  _Atomic uint32_t job;       /* number of the current job */
  _Atomic int32_t invited;    /* workers 1 .. invited-1 take part in the current job */
  _Atomic int32_t sleepers;
  _Atomic int32_t running[KILN_POOL_MAX];  /* worker slot in use (changed under lock) */
  kiln_task_fn task;          /* the current job, stable while it has chunks in flight */
  void* ctx;
  int64_t n, chunk, longer;   /* chunk k: `chunk` iterations, one more for k < `longer` */
  _Atomic int64_t nchunks;
} kiln_pool_t;

static kiln_pool_t kiln_pool = {
  .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
  .busy = PTHREAD_MUTEX_INITIALIZER,
};
static __thread int32_t kiln_thread_limit;  /* kiln_set_num_threads of this thread; 0: default */
static int32_t kiln_default_threads_value;
static double kiln_spin_seconds = 50e-6, kiln_idle_seconds = 5.0;
static pthread_once_t kiln_pool_once = PTHREAD_ONCE_INIT;

static int32_t kiln_env_int(const char* name, int32_t fallback) {
  const char* v = getenv(name);
  if (v == NULL || *v == 0) return fallback;
  long x = strtol(v, NULL, 10);  /* OMP_NUM_THREADS may be a list: its first entry */
  return x > 0 ? (int32_t)x : fallback;
}

static void kiln_pool_after_fork(void) {
  /* the child has none of the parent's threads: no workers, fresh locks */
  pthread_mutex_init(&kiln_pool.lock, NULL);
  pthread_cond_init(&kiln_pool.wake, NULL);
  pthread_mutex_init(&kiln_pool.busy, NULL);
  for (int32_t slot = 0; slot < KILN_POOL_MAX; ++slot) {
    atomic_store(&kiln_pool.running[slot], 0);
  }
  atomic_store(&kiln_pool.sleepers, 0);
}

static void kiln_pool_init(void) {
  int32_t cpus = 1;
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
#else
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n > 0) cpus = (int32_t)n;
#endif
  kiln_default_threads_value = kiln_env_int("KILN_NUM_THREADS",
                                            kiln_env_int("OMP_NUM_THREADS", cpus));
  kiln_spin_seconds = 1e-6 * kiln_env_int("KILN_POOL_SPIN_US", 50);
  kiln_idle_seconds = kiln_env_int("KILN_POOL_IDLE_S", 5);
  pthread_atfork(NULL, NULL, kiln_pool_after_fork);
}

static int32_t kiln_default_threads(void) {
  pthread_once(&kiln_pool_once, kiln_pool_init);
  return kiln_default_threads_value;
}

void kiln_set_num_threads(int32_t n) { kiln_thread_limit = n > 0 ? n : 0; }

int32_t kiln_get_max_threads(void) {
  return kiln_thread_limit > 0 ? kiln_thread_limit : kiln_default_threads();
}

/* Take and run chunks of job `job` until none is left (or a newer job started). */
static void kiln_pool_work(uint32_t job) {
  for (;;) {
    uint64_t c = atomic_load_explicit(&kiln_pool.claim, memory_order_acquire);
    if ((uint32_t)(c >> KILN_IDX_BITS) != job) return;
    int64_t k = (int64_t)(c & KILN_IDX_MASK);
    /* (a newer job's count: the CAS below fails) */
    if (k >= atomic_load_explicit(&kiln_pool.nchunks, memory_order_relaxed)) return;
    if (!atomic_compare_exchange_weak_explicit(&kiln_pool.claim, &c, c + 1,
                                               memory_order_acq_rel, memory_order_acquire)) {
      continue;
    }
    /* chunk k is ours: the job cannot end (nor its fields change) before we report it */
    int64_t extra = k < kiln_pool.longer ? k : kiln_pool.longer;
    int64_t begin = k * kiln_pool.chunk + extra;
    int64_t end = begin + kiln_pool.chunk + (k < kiln_pool.longer);
    kiln_pool.task(kiln_pool.ctx, begin, end);
    atomic_fetch_add_explicit(&kiln_pool.done, 1, memory_order_release);
  }
}

/* Wait (spin, then sleep) for a job other than `seen`; -1 after an idle timeout. */
static int64_t kiln_pool_wait(uint32_t seen) {
  double start = kiln_pool_now();
  for (uint32_t i = 1;; ++i) {
    uint32_t j = atomic_load_explicit(&kiln_pool.job, memory_order_acquire);
    if (j != seen) return j;
    kiln_pause();
    if ((i & 63) == 0 && kiln_pool_now() - start > kiln_spin_seconds) break;
  }
  pthread_mutex_lock(&kiln_pool.lock);
  atomic_fetch_add(&kiln_pool.sleepers, 1);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)kiln_idle_seconds;
  int64_t result = -1;
  for (;;) {
    uint32_t j = atomic_load(&kiln_pool.job);
    if (j != seen) { result = j; break; }
    if (pthread_cond_timedwait(&kiln_pool.wake, &kiln_pool.lock, &until) != 0) {
      j = atomic_load(&kiln_pool.job);
      result = j != seen ? (int64_t)j : -1;
      break;
    }
  }
  atomic_fetch_sub(&kiln_pool.sleepers, 1);
  pthread_mutex_unlock(&kiln_pool.lock);
  return result;
}

static void* kiln_pool_worker(void* arg) {
  /* started for the job after `seen`, which its caller publishes next */
  int32_t slot = (int32_t)((intptr_t)arg & 0xff);
  uint32_t seen = (uint32_t)((intptr_t)arg >> 8);
#if defined(__GLIBC__)
  pthread_setname_np(pthread_self(), "kiln-pool");  /* as `top -H` and /proc show it */
#endif
  for (;;) {
    int64_t j = kiln_pool_wait(seen);
    if (j < 0) {  /* idle too long: leave (started again when needed) */
      pthread_mutex_lock(&kiln_pool.lock);
      if (atomic_load(&kiln_pool.job) == seen) {
        atomic_store(&kiln_pool.running[slot], 0);
        pthread_mutex_unlock(&kiln_pool.lock);
        return NULL;
      }
      j = atomic_load(&kiln_pool.job);
      pthread_mutex_unlock(&kiln_pool.lock);
    }
    seen = (uint32_t)j;
    if (slot < atomic_load_explicit(&kiln_pool.invited, memory_order_acquire)) {
      kiln_pool_work(seen);
    }
  }
}

/* Start workers 1 .. count-1 that are not running (called by the caller owning the pool,
   before it publishes its job). */
static void kiln_pool_start(int32_t count) {
  int32_t missing = 0;
  for (int32_t slot = 1; slot < count; ++slot) {
    missing |= !atomic_load_explicit(&kiln_pool.running[slot], memory_order_relaxed);
  }
  if (!missing) return;
  uint32_t job = atomic_load(&kiln_pool.job);
  pthread_mutex_lock(&kiln_pool.lock);
  for (int32_t slot = 1; slot < count; ++slot) {
    if (atomic_load(&kiln_pool.running[slot])) continue;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* signals go to the application's threads */
    pthread_t t;
    intptr_t arg = (intptr_t)slot | ((intptr_t)job << 8);
    if (pthread_create(&t, &attr, kiln_pool_worker, (void*)arg) == 0) {
      atomic_store(&kiln_pool.running[slot], 1);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
  }
  pthread_mutex_unlock(&kiln_pool.lock);
}

void kiln_parallel_for(kiln_task_fn task, void* ctx, int64_t n, int32_t threads) {
  if (n <= 0) return;
  pthread_once(&kiln_pool_once, kiln_pool_init);
  int32_t t = threads > 0 ? threads : kiln_get_max_threads();
  if (t > KILN_POOL_MAX) t = KILN_POOL_MAX;
  if ((int64_t)t > n) t = (int32_t)n;
  if (t <= 1 || pthread_mutex_trylock(&kiln_pool.busy) != 0) {
    task(ctx, 0, n);  /* one thread, or the pool runs another thread's loop: run it here */
    return;
  }
  kiln_pool_start(t);
  int64_t wanted = 4 * (int64_t)t;
  int64_t nchunks = n < wanted ? n : wanted;
  kiln_pool.task = task;
  kiln_pool.ctx = ctx;
  kiln_pool.n = n;
  kiln_pool.chunk = n / nchunks;
  kiln_pool.longer = n % nchunks;
  atomic_store_explicit(&kiln_pool.nchunks, nchunks, memory_order_relaxed);
  atomic_store_explicit(&kiln_pool.done, 0, memory_order_relaxed);
  atomic_store_explicit(&kiln_pool.invited, t, memory_order_relaxed);
  uint32_t job = (atomic_load(&kiln_pool.job) + 1) & ((1u << KILN_SEQ_BITS) - 1);
  atomic_store_explicit(&kiln_pool.claim, (uint64_t)job << KILN_IDX_BITS, memory_order_release);
  atomic_store(&kiln_pool.job, job);  /* publishes the job (sequentially consistent) */
  if (atomic_load(&kiln_pool.sleepers) > 0) {
    pthread_mutex_lock(&kiln_pool.lock);
    pthread_cond_broadcast(&kiln_pool.wake);
    pthread_mutex_unlock(&kiln_pool.lock);
  }
  kiln_pool_work(job);
  /* chunks other threads took are finishing: spin briefly, then give up the CPU (a worker
     holding a chunk may be waiting for it) */
  for (uint32_t i = 1;
       atomic_load_explicit(&kiln_pool.done, memory_order_acquire) < nchunks; ++i) {
    if (i < 4096) {
      kiln_pause();
    } else {
      sched_yield();
    }
  }
  pthread_mutex_unlock(&kiln_pool.busy);
}
"""
