/*
 * The runtime hooks of wick's WebAssembly kernel set, linked into kernels.wasm beside the
 * kernels (compiler/wasm_kernels.py). TVM's LLVM code calls back into a runtime for three
 * things; natively TVM's own runtime provides them (native/cpu_backend.py), in the browser
 * this file does:
 *
 * - scratch memory over 1 KiB (__TVMBackendAllocWorkspace / __TVMBackendFreeWorkspace):
 *   wasi-libc's malloc, the same heap the executor allocates its buffers from, so neither
 *   grows memory behind the other's back;
 * - parallel loops (__TVMBackendParallelLaunch): the loop body is TVM's lambda, called here
 *   for every task; one task covers the whole range on a single thread;
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

/* Function-pointer slots TVM's code reads (defined, null, in the kernels' object). */
extern void* __TVMBackendParallelLaunch;
extern void* __TVMBackendAllocWorkspace;
extern void* __TVMBackendFreeWorkspace;

#define ALIGN 64 /* what TVM's CPU code assumes of a tensor's data pointer */

static int parallel_launch(ParallelLambda body, void* cdata, int num_task) {
  (void)num_task; /* a hint; one task takes the whole range */
  ParallelGroupEnv env = {0, 1};
  return body(0, &env, cdata);
}

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int dtype_code,
                             int dtype_bits) {
  (void)device_type; (void)device_id; (void)dtype_code; (void)dtype_bits;
  size_t n = (size_t)((nbytes + ALIGN - 1) / ALIGN * ALIGN);
  return aligned_alloc(ALIGN, n ? n : ALIGN);
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  free(ptr);
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
  __TVMBackendParallelLaunch = (void*)parallel_launch;
  __TVMBackendAllocWorkspace = (void*)alloc_workspace;
  __TVMBackendFreeWorkspace = (void*)free_workspace;
}

__attribute__((export_name("wick_error"))) const char* wick_error(void) { return last_error; }

/* A zero-filled buffer of nbytes at a 64-byte aligned address, 0 when memory is exhausted. */
__attribute__((export_name("wick_alloc"))) void* wick_alloc(uint32_t nbytes) {
  size_t n = (nbytes + ALIGN - 1) / ALIGN * ALIGN;
  void* p = aligned_alloc(ALIGN, n ? n : ALIGN);
  if (p) memset(p, 0, n ? n : ALIGN);
  return p;
}

__attribute__((export_name("wick_free"))) void wick_free(void* ptr) { free(ptr); }
