/*
 * The runtime hooks of wick's CPU kernel sets, linked beside the kernels into each library:
 * natively into kernels.so (compiler/targets/cpu.py, run by native/cpu_backend.py through
 * ctypes), and into kernels.wasm / kernels-threads.wasm (compiler/targets/wasm.py, run by
 * web/src/wasm_executor.ts). TVM's LLVM code calls back into a runtime for three things, and
 * this file is that runtime, so a kernel set needs neither TVM's runtime nor anything but libc:
 *
 * - scratch memory over 1 KiB (__TVMBackendAllocWorkspace / __TVMBackendFreeWorkspace):
 *   aligned_alloc, the same heap the wasm executor allocates its buffers from, so neither
 *   grows memory behind the other's back;
 * - parallel loops (__TVMBackendParallelLaunch): the loop body is TVM's lambda. With threads
 *   (natively always; in wasm when built WICK_THREADS, kernels-threads.wasm over shared
 *   memory) the tasks are split between the calling thread and the helper threads that are
 *   ready: natively pthreads started by wick_set_threads, in a browser web workers running
 *   wick_thread_main over the same memory. Otherwise, or with none ready, or while another
 *   thread's loop holds the pool, one task covers the whole range;
 * - errors (TVMFFIErrorSetRaisedFromCStrParts): a kernel's own checks (shapes, dtypes) write
 *   their message here and return non-zero; the caller reads it with wick_error().
 *
 * The caller calls wick_init() once, then the kernels' exported __tvm_ffi_<name> functions
 * (natively a step's calls at once: wick_run_calls).
 */
#if !defined(__wasm__) && defined(__linux__)
#define _GNU_SOURCE /* (CPU_SET, pthread_attr_setaffinity_np) */
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__wasm__)
#define EXPORT(name) __attribute__((export_name(#name)))
#define THREAD_LOCAL
#else
#define EXPORT(name) __attribute__((visibility("default")))
#define THREAD_LOCAL _Thread_local
#define WICK_THREADS 1
#include <pthread.h>
#include <sched.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

typedef struct {
  void* sync_handle;
  int32_t num_task;
} ParallelGroupEnv;
typedef int (*ParallelLambda)(int task_id, ParallelGroupEnv* env, void* cdata);

/* Function-pointer slots TVM's code reads (defined, null, in the kernels' object; weak: a
 * kernel set whose kernels never need one has no slot, e.g. no scratch memory) */
extern void* __TVMBackendParallelLaunch __attribute__((weak));
extern void* __TVMBackendAllocWorkspace __attribute__((weak));
extern void* __TVMBackendFreeWorkspace __attribute__((weak));

#define ALIGN 64 /* what TVM's CPU code assumes of a tensor's data pointer */

#ifdef WICK_THREADS
/* Sleeping and waking a helper parked on `generation` */
#if defined(__wasm__)
#define MAX_THREADS 16 /* (web/src/wasm_executor.ts starts at most this many) */
static void park(int32_t* word, int32_t seen) {
  __builtin_wasm_memory_atomic_wait32(word, seen, -1);
}
static void wake_all(int32_t* word) { __builtin_wasm_memory_atomic_notify(word, MAX_THREADS); }
static void relax(void) {}
#else
#define MAX_THREADS 256
#if defined(__linux__)
static void park(int32_t* word, int32_t seen) {
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}
static void wake_all(int32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, MAX_THREADS, NULL, NULL, 0);
}
#else /* (no futex: a parked helper yields instead of sleeping) */
static void park(int32_t* word, int32_t seen) { (void)word; (void)seen; sched_yield(); }
static void wake_all(int32_t* word) { (void)word; }
#endif
#if defined(__x86_64__) || defined(__i386__)
static void relax(void) { __builtin_ia32_pause(); }
#else
static void relax(void) {}
#endif
#endif

/* The pool: helper k (1..MAX_THREADS-1) sets ready[k] once it runs. A launch takes this thread
 * and the helpers ready in a row from 1 (up to `wanted`), publishes the job and bumps
 * `generation` (a launch count, with the job's task count in its low bits: a helper outside
 * the job learns so from the word itself, never reading a job that may already be the next
 * one); helpers spin on it a while, then sleep on it, run their task and count themselves in
 * `done`. The launching thread runs task 0, then spins until all are done:
 * kernel calls are short and come back to back within a step. `busy` keeps a second thread's
 * launch (two engines on one library) from taking the pool mid-job: it runs alone. */
#define SPINS (1 << 16)
#define TASK_BITS 9 /* (MAX_THREADS < 1 << TASK_BITS) */
static int32_t ready[MAX_THREADS];
static struct {
  ParallelLambda body;
  void* cdata;
} job;
static int32_t generation, done, job_failed, sleepers, busy;
static int32_t wanted = MAX_THREADS;
static int32_t helper_tasks; /* tasks run by helper threads so far (stats) */

static int parallel_launch(ParallelLambda body, void* cdata, int num_task) {
  int32_t n = 1, most = __atomic_load_n(&wanted, __ATOMIC_RELAXED);
  while (n < most && __atomic_load_n(&ready[n], __ATOMIC_ACQUIRE)) n++;
  if (num_task > 0 && num_task < n) n = num_task;
  if (n > 1 && __atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) n = 1;
  ParallelGroupEnv env = {0, n};
  if (n == 1) return body(0, &env, cdata);
  job.body = body;
  job.cdata = cdata;
  job_failed = 0;
  __atomic_store_n(&done, 0, __ATOMIC_RELAXED);
  uint32_t launches = (uint32_t)__atomic_load_n(&generation, __ATOMIC_RELAXED) >> TASK_BITS;
  __atomic_store_n(&generation, (int32_t)(((launches + 1) << TASK_BITS) | (uint32_t)n),
                   __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST)) wake_all(&generation);
  int rc = body(0, &env, cdata);
  while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) < n - 1) relax();
  rc = rc ? rc : job_failed;
  __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
  return rc;
}

/* A helper thread's life: index k in 1..MAX_THREADS-1; never returns. */
EXPORT(wick_thread_main) void wick_thread_main(int32_t index) {
  if (index < 1 || index >= MAX_THREADS) return;
  int32_t seen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
  __atomic_store_n(&ready[index], 1, __ATOMIC_RELEASE);
  for (;;) {
    int32_t now;
    int spins = 0;
    while ((now = __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) == seen) {
      if (++spins > SPINS) {
        /* (seq_cst against the launcher's bump-then-read: it wakes us, or we see the bump) */
        __atomic_fetch_add(&sleepers, 1, __ATOMIC_SEQ_CST);
        park(&generation, seen);
        __atomic_fetch_sub(&sleepers, 1, __ATOMIC_SEQ_CST);
        spins = 0;
      } else {
        relax();
      }
    }
    seen = now;
    int32_t num_task = (int32_t)((uint32_t)now & ((1u << TASK_BITS) - 1));
    if (index >= num_task) { /* not in this job (fewer threads wanted): sleep, do not spin */
      __atomic_fetch_add(&sleepers, 1, __ATOMIC_SEQ_CST);
      park(&generation, seen);
      __atomic_fetch_sub(&sleepers, 1, __ATOMIC_SEQ_CST);
      continue;
    }
    ParallelGroupEnv env = {0, num_task};
    int rc = job.body(index, &env, job.cdata);
    if (rc) job_failed = rc;
    __atomic_fetch_add(&helper_tasks, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
  }
}

EXPORT(wick_helper_tasks) int32_t wick_helper_tasks(void) {
  return __atomic_load_n(&helper_tasks, __ATOMIC_RELAXED);
}

#if !defined(__wasm__)
static void* helper_main(void* index) {
  wick_thread_main((int32_t)(intptr_t)index);
  return NULL;
}

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static int32_t started = 1; /* this thread counts as the first */

/* Parallel loops use `threads` threads (this one and threads - 1 helpers), started as needed,
 * each allowed on the `ncpus` CPUs listed (none: the starting thread's own set, which a
 * runtime that pinned this thread to one core would otherwise hand down to every helper).
 * Returns how many threads the pool now has (fewer when the system refuses one). */
EXPORT(wick_set_threads) int32_t wick_set_threads(int32_t threads, const int32_t* cpus,
                                                  int32_t ncpus) {
  if (threads < 1) threads = 1;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  pthread_mutex_lock(&start_lock);
  while (started < threads) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
#if defined(__linux__)
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    for (int32_t i = 0; i < ncpus; i++) {
      if (cpus[i] >= 0 && cpus[i] < CPU_SETSIZE) CPU_SET(cpus[i], &allowed);
    }
    if (ncpus > 0) pthread_attr_setaffinity_np(&attr, sizeof allowed, &allowed);
#else
    (void)cpus; (void)ncpus;
#endif
    int failed = pthread_create(&t, &attr, helper_main, (void*)(intptr_t)started);
    pthread_attr_destroy(&attr);
    if (failed) break;
    started++;
  }
  int32_t have = started < threads ? started : threads;
  __atomic_store_n(&wanted, have, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&start_lock);
  return have;
}

/* One pool per process: a library loaded after another runs its parallel loops on the first
 * one's pool (its own would keep a second set of helpers spinning on the same cores). */
EXPORT(wick_parallel_launch) int wick_parallel_launch(ParallelLambda body, void* cdata,
                                                      int num_task) {
  return parallel_launch(body, cdata, num_task);
}

EXPORT(wick_use_pool) void wick_use_pool(void* launch) {
  if (&__TVMBackendParallelLaunch) __TVMBackendParallelLaunch = launch;
}
#endif
#else
static int parallel_launch(ParallelLambda body, void* cdata, int num_task) {
  (void)num_task; /* a hint; one task takes the whole range */
  ParallelGroupEnv env = {0, 1};
  return body(0, &env, cdata);
}
#endif

/* wasi-libc's malloc is not thread-safe (single-threaded libc): kernels on helper threads may
 * ask for scratch at the same time as this one. Natively libc's malloc is. */
#if defined(__wasm__) && defined(WICK_THREADS)
static int32_t heap_lock;
static void lock(void) {
  while (__atomic_exchange_n(&heap_lock, 1, __ATOMIC_ACQUIRE)) {
  }
}
static void unlock(void) { __atomic_store_n(&heap_lock, 0, __ATOMIC_RELEASE); }
#else
static void lock(void) {}
static void unlock(void) {}
#endif

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int dtype_code,
                             int dtype_bits) {
  (void)device_type; (void)device_id; (void)dtype_code; (void)dtype_bits;
  size_t n = (size_t)((nbytes + ALIGN - 1) / ALIGN * ALIGN);
  lock();
  void* p = aligned_alloc(ALIGN, n ? n : ALIGN);
  unlock();
  return p;
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  lock();
  free(ptr);
  unlock();
  return 0;
}

static THREAD_LOCAL char last_error[2048];

static size_t append(size_t at, const char* s) {
  while (s && *s && at < sizeof(last_error) - 1) last_error[at++] = *s++;
  return at;
}

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t num_parts) {
  size_t at = append(0, kind);
  at = append(at, ": ");
  for (int32_t i = 0; i < num_parts; i++) at = append(at, parts[i]);
  last_error[at] = 0;
}

EXPORT(wick_init) void wick_init(void) {
  if (&__TVMBackendParallelLaunch) __TVMBackendParallelLaunch = (void*)parallel_launch;
  if (&__TVMBackendAllocWorkspace) __TVMBackendAllocWorkspace = (void*)alloc_workspace;
  if (&__TVMBackendFreeWorkspace) __TVMBackendFreeWorkspace = (void*)free_workspace;
}

EXPORT(wick_error) const char* wick_error(void) { return last_error; }

#if !defined(__wasm__)
typedef int (*PackedCall)(void* self, const void* args, int32_t num_args, void* result);

/* A step's kernel calls in one foreign call (native/cpu_backend.py): calls fns[i] on its packed
   arguments args[i] (num_args[i] of them), in order. Returns -1 when every call ran, else the
   index of the one that failed (its message: that kernel's library's wick_error). Through
   ctypes each call cost the interpreter ~2.5 us, ~0.8 ms of a small model's 300-call step. */
EXPORT(wick_run_calls)
int32_t wick_run_calls(int32_t n, void* const* fns, void* const* args, const int32_t* num_args,
                       void* result) {
  for (int32_t i = 0; i < n; i++) {
    if (((PackedCall)fns[i])(0, args[i], num_args[i], result)) return i;
  }
  return -1;
}
#endif

/* (after reading it: a later failure that sets no message must not show this one) */
EXPORT(wick_clear_error) void wick_clear_error(void) { last_error[0] = 0; }

#if defined(__wasm__)
/* A zero-filled buffer of nbytes at a 64-byte aligned address, 0 when memory is exhausted.
   Memory the allocator has just grown is zero already (memory.grow fills new pages with
   zeros, and the allocator writes only its headers outside a buffer): only the part below the
   memory's size before this allocation is cleared. An engine's KV pool, most of its memory,
   is then not written (and not paged in) until it is used. */
EXPORT(wick_alloc) void* wick_alloc(uint32_t nbytes) {
  size_t n = (nbytes + ALIGN - 1) / ALIGN * ALIGN;
  if (!n) n = ALIGN;
  lock();
  uintptr_t grown_from = __builtin_wasm_memory_size(0) * 65536;
  void* p = aligned_alloc(ALIGN, n);
  unlock();
  if (p && (uintptr_t)p < grown_from) {
    uintptr_t end = (uintptr_t)p + n;
    memset(p, 0, (end < grown_from ? end : grown_from) - (uintptr_t)p);
  }
  return p;
}

EXPORT(wick_free) void wick_free(void* ptr) {
  lock();
  free(ptr);
  unlock();
}
#endif
