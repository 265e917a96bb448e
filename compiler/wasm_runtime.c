/*
 * The runtime hooks of wick's WebAssembly kernel set, linked into kernels.wasm beside the
 * kernels (compiler/wasm_kernels.py). TVM's LLVM code calls back into a runtime for three
 * things; natively TVM's own runtime provides them (native/cpu_backend.py), in the browser
 * this file does:
 *
 * - scratch memory over 1 KiB (__TVMBackendAllocWorkspace / __TVMBackendFreeWorkspace):
 *   wasi-libc's malloc, the same heap the executor allocates its buffers from, so neither
 *   grows memory behind the other's back;
 * - parallel loops (__TVMBackendParallelLaunch): the loop body is TVM's lambda. Built with
 *   WICK_THREADS (kernels-threads.wasm, shared memory), the tasks are split between this
 *   thread and the helper threads (web workers running wick_thread_main over the same memory)
 *   that are ready; otherwise, or with none ready, one task covers the whole range;
 * - errors (TVMFFIErrorSetRaisedFromCStrParts): a kernel's own checks (shapes, dtypes) write
 *   their message here and return non-zero; the executor reads it with wick_error().
 *
 * The executor (web/src/wasm_executor.ts) calls wick_init() once, then allocates its buffers
 * with wick_alloc / wick_free and calls the kernels' exported __tvm_ffi_<name> functions.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
/* The pool: helper k (1..MAX_THREADS-1) sets ready[k] once it runs. A launch takes this thread
 * and the helpers ready in a row from 1, publishes the job and bumps `generation`; helpers
 * spin on it a while, then sleep on it (memory.atomic.wait32), run their task and count
 * themselves in `done`. The launching thread runs task 0, then spins until all are done:
 * kernel calls are short and come back to back within a step. */
#define MAX_THREADS 16
#define SPINS (1 << 16)
static int32_t ready[MAX_THREADS];
static struct {
  ParallelLambda body;
  void* cdata;
  int32_t num_task;
} job;
static int32_t generation, done, job_failed;
static int32_t helper_tasks; /* tasks run by helper threads so far (stats) */

static int parallel_launch(ParallelLambda body, void* cdata, int num_task) {
  int32_t n = 1;
  while (n < MAX_THREADS && __atomic_load_n(&ready[n], __ATOMIC_ACQUIRE)) n++;
  if (num_task > 0 && num_task < n) n = num_task;
  ParallelGroupEnv env = {0, n};
  if (n == 1) return body(0, &env, cdata);
  job.body = body;
  job.cdata = cdata;
  job.num_task = n;
  job_failed = 0;
  __atomic_store_n(&done, 0, __ATOMIC_RELAXED);
  __atomic_fetch_add(&generation, 1, __ATOMIC_RELEASE);
  __builtin_wasm_memory_atomic_notify(&generation, MAX_THREADS);
  int rc = body(0, &env, cdata);
  while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) < n - 1) {
  }
  return rc ? rc : job_failed;
}

/* A helper thread's life: index k in 1..MAX_THREADS-1; never returns. */
__attribute__((export_name("wick_thread_main"))) void wick_thread_main(int32_t index) {
  if (index < 1 || index >= MAX_THREADS) return;
  int32_t seen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
  __atomic_store_n(&ready[index], 1, __ATOMIC_RELEASE);
  for (;;) {
    int32_t now;
    int spins = 0;
    while ((now = __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) == seen) {
      if (++spins > SPINS) __builtin_wasm_memory_atomic_wait32(&generation, seen, -1);
    }
    seen = now;
    if (index >= job.num_task) continue; /* (ready after this job was split) */
    ParallelGroupEnv env = {0, job.num_task};
    int rc = job.body(index, &env, job.cdata);
    if (rc) job_failed = rc;
    __atomic_fetch_add(&helper_tasks, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
  }
}

__attribute__((export_name("wick_helper_tasks"))) int32_t wick_helper_tasks(void) {
  return __atomic_load_n(&helper_tasks, __ATOMIC_RELAXED);
}

/* malloc is not thread-safe here (single-threaded wasi-libc): kernels on helper threads may
 * ask for scratch at the same time as this one. */
static int32_t heap_lock;
static void lock(void) {
  while (__atomic_exchange_n(&heap_lock, 1, __ATOMIC_ACQUIRE)) {
  }
}
static void unlock(void) { __atomic_store_n(&heap_lock, 0, __ATOMIC_RELEASE); }
#else
static int parallel_launch(ParallelLambda body, void* cdata, int num_task) {
  (void)num_task; /* a hint; one task takes the whole range */
  ParallelGroupEnv env = {0, 1};
  return body(0, &env, cdata);
}
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

static char last_error[2048];

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

__attribute__((export_name("wick_init"))) void wick_init(void) {
  if (&__TVMBackendParallelLaunch) __TVMBackendParallelLaunch = (void*)parallel_launch;
  if (&__TVMBackendAllocWorkspace) __TVMBackendAllocWorkspace = (void*)alloc_workspace;
  if (&__TVMBackendFreeWorkspace) __TVMBackendFreeWorkspace = (void*)free_workspace;
}

__attribute__((export_name("wick_error"))) const char* wick_error(void) { return last_error; }

/* A zero-filled buffer of nbytes at a 64-byte aligned address, 0 when memory is exhausted. */
__attribute__((export_name("wick_alloc"))) void* wick_alloc(uint32_t nbytes) {
  size_t n = (nbytes + ALIGN - 1) / ALIGN * ALIGN;
  lock();
  void* p = aligned_alloc(ALIGN, n ? n : ALIGN);
  unlock();
  if (p) memset(p, 0, n ? n : ALIGN);
  return p;
}

__attribute__((export_name("wick_free"))) void wick_free(void* ptr) {
  lock();
  free(ptr);
  unlock();
}
