"""kiln's thread pool (kiln/codegen/c/thread_pool.py), driven directly from a small C harness:
every iteration runs once, the thread count is respected per calling thread, concurrent callers,
fork, idle workers leaving."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from kiln.codegen.c import thread_pool
from kiln.codegen.c.build import FEATURES
from kiln.codegen.c.compiler import compile_source

HARNESS = r"""
#include <string.h>
/* every iteration adds 1 to hits[i] and spins a little; the threads that ran tasks are
   recorded (distinct ones counted) */
typedef struct { int32_t* hits; int64_t spin; pthread_mutex_t lock; pthread_t seen[64];
                 int32_t nseen; } mark_ctx;

static void mark(void* c, int64_t begin, int64_t end) {
  mark_ctx* m = (mark_ctx*)c;
  pthread_t me = pthread_self();
  pthread_mutex_lock(&m->lock);
  int known = 0;
  for (int32_t k = 0; k < m->nseen; ++k) known |= pthread_equal(m->seen[k], me);
  if (!known && m->nseen < 64) m->seen[m->nseen++] = me;
  pthread_mutex_unlock(&m->lock);
  for (int64_t i = begin; i < end; ++i) {
    __atomic_fetch_add(&m->hits[i], 1, __ATOMIC_RELAXED);
    for (volatile int64_t s = 0; s < m->spin; ++s) {}
  }
}

/* Runs the loop; returns how many distinct threads ran it. */
int32_t run_mark(int32_t* hits, int64_t n, int32_t threads, int64_t spin) {
  mark_ctx m;
  memset(&m, 0, sizeof(m));
  m.hits = hits;
  m.spin = spin;
  pthread_mutex_init(&m.lock, NULL);
  kiln_parallel_for(mark, &m, n, threads);
  pthread_mutex_destroy(&m.lock);
  return m.nseen;
}

/* Records the size of every chunk at its first iteration. */
static void record(void* c, int64_t begin, int64_t end) { ((int64_t*)c)[begin] = end - begin; }

void run_record(int64_t* sizes, int64_t n, int32_t threads) {
  kiln_parallel_for(record, sizes, n, threads);
}
"""


@pytest.fixture(scope="module")
def lib():
    source = (FEATURES + "#include <stdint.h>\n#include <stdlib.h>\n" + thread_pool.DECLARATIONS
              + thread_pool.SOURCE + HARNESS)
    result = compile_source(source)
    lib = ctypes.CDLL(result.lib_path)
    lib.run_mark.restype = ctypes.c_int32
    lib.run_mark.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64)
    lib.run_record.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)
    lib.kiln_set_num_threads.argtypes = (ctypes.c_int32,)
    lib.kiln_get_max_threads.restype = ctypes.c_int32
    return lib


def _run(lib, n, threads, spin=0):
    hits = np.zeros(max(n, 1), np.int32)
    distinct = lib.run_mark(hits.ctypes.data, n, threads, spin)
    return hits[:n], distinct


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 100003])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_every_iteration_runs_once(lib, n, threads):
    hits, distinct = _run(lib, n, threads)
    assert (hits == 1).all()
    assert distinct <= max(1, min(threads, n))


@pytest.mark.parametrize("n", [2, 9, 14, 35, 100003])
@pytest.mark.parametrize("threads", [2, 3])
def test_chunks_are_even(lib, n, threads):
    """Four chunks per thread (fewer when there are fewer iterations), their sizes at most
    one apart, the larger first, together covering the loop: a loop of 14 for 2 threads is
    8 chunks of 2 or 1 (7 per thread), not 7 of 2 (8 for one thread, 6 for the other)."""
    sizes = np.zeros(n, np.int64)
    lib.run_record(sizes.ctypes.data, n, threads)
    chunks = sizes[sizes > 0]
    assert chunks.sum() == n
    assert len(chunks) == min(n, 4 * threads)
    assert chunks.max() - chunks.min() <= 1
    assert (np.diff(chunks) <= 0).all()


def test_the_thread_count_is_respected_per_calling_thread(lib):
    """Enough work for the workers to join: never more threads than asked, more than one
    when asked for several; kiln_set_num_threads sets it for the calling thread only."""
    seen = set()
    for _ in range(20):  # (workers join when the scheduler runs them: on a busy machine the
        hits, distinct = _run(lib, 64, 4, spin=200_000)  # caller may do it all, by design)
        assert (hits == 1).all() and 1 <= distinct <= 4
        seen.add(distinct)
        if distinct >= 2:
            break
    assert max(seen) >= 2
    lib.kiln_set_num_threads(1)
    try:
        assert lib.kiln_get_max_threads() == 1
        hits, distinct = _run(lib, 64, 0, spin=50_000)  # 0: the caller's setting
        assert (hits == 1).all() and distinct == 1
        seen = []
        other = threading.Thread(target=lambda: seen.append(lib.kiln_get_max_threads()))
        other.start()
        other.join()
        assert seen[0] == len(os.sched_getaffinity(0)) or "OMP_NUM_THREADS" in os.environ \
            or "KILN_NUM_THREADS" in os.environ
    finally:
        lib.kiln_set_num_threads(0)
    assert lib.kiln_get_max_threads() >= 1


def test_concurrent_callers(lib):
    """Eight threads start loops at once: the pool runs one loop at a time, the others run on
    their caller's thread; every iteration of every loop runs exactly once."""
    failures = []
    start = threading.Barrier(8)

    def caller(k):
        start.wait()
        for i in range(30):
            hits, distinct = _run(lib, 500 + 37 * k + i, 2 + k % 3, spin=100)
            if not (hits == 1).all():
                failures.append((k, i))

    workers = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not failures


_CHILD = r"""
import ctypes, os, sys, time
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
lib.run_mark.restype = ctypes.c_int32
lib.run_mark.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64)
def run(n, t, spin):
    hits = np.zeros(n, np.int32)
    d = lib.run_mark(hits.ctypes.data, n, t, spin)
    assert (hits == 1).all(), "wrong hits"
    return d
def threads():
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    return names.count("kiln-pool")
before = threads()
assert run(64, 3, 200000) >= 1
deadline = time.time() + 20  # (a worker takes its name once the scheduler first runs it)
while threads() < 2 and time.time() < deadline:
    time.sleep(0.05)
started = threads()
pid = os.fork()
if pid == 0:  # the child has no workers: its loops still run, with fresh ones
    try:
        ok = run(64, 3, 200000) >= 1 and run(1000, 2, 0) >= 1
    except BaseException:
        ok = False
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert status == 0, f"child failed: {status}"
deadline = time.time() + 20  # KILN_POOL_IDLE_S=1: idle workers leave after a second
while threads() and time.time() < deadline:
    time.sleep(0.1)
print(before, started, threads())
"""


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self/task"),
                    reason="needs fork and /proc")
def test_fork_and_idle_workers_leave(lib, tmp_path):
    out = subprocess.run([sys.executable, "-c", _CHILD, lib._name], capture_output=True,
                         text=True, env={**os.environ, "KILN_POOL_IDLE_S": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr
    before, started, after = map(int, out.stdout.split())
    assert (before, started, after) == (0, 2, 0), out.stdout  # kiln-pool workers
