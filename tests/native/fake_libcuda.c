/* A stand-in for NVIDIA's libcuda with the driver API entry points native/cuda_driver.py calls,
 * over host memory: "device" pointers are malloc'd, copies are memcpy, and a launch of the
 * kernel named "fake_scale_add" runs it on the CPU (x[i] = x[i] * s + 1 for i < n, with
 * arguments (float *x, int64_t n, float s)), so a test sees what cuLaunchKernel was given.
 * Stream capture records launches into a graph; launching the graph runs them again. As in
 * CUDA, the context is current per thread: a call on a thread that has not made it current
 * fails with CUDA_ERROR_INVALID_CONTEXT.
 * Test-only (tests/native/test_cuda_driver.py); built with the system C compiler. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

typedef struct {
  const char *name;
  unsigned grid[3], block[3], shared;
  void **params;
} Launch;

#define MAX_LAUNCHES 1024
static Launch capture[MAX_LAUNCHES];
static int capturing = -1; /* launches recorded so far, -1: not capturing */
#define MAX_GRAPHS 256
static Launch *graphs[MAX_GRAPHS];
static int graph_sizes[MAX_GRAPHS];
static int num_graphs; /* graphs ever made: a destroyed one's handle is never reused */
static __thread void *current; /* the context current on this thread */
#define NEED_CONTEXT if (current != (void *)0x10) return 201 /* CUDA_ERROR_INVALID_CONTEXT */
int fake_launches; /* kernels run, eagerly or from a graph */
int fake_graph_launches;

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) {
  *s = e == 500 ? "named symbol not found (fake)" : "error (fake)";
  return 0;
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return ordinal == 0 ? 0 : 101; }
CUresult cuDeviceGetName(char *name, int len, int dev) {
  strncpy(name, "Fake H100", len);
  return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  *v = attr == 75 ? 9 : 0; /* compute capability 9.0 */
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) { *bytes = (size_t)80 << 30; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)0x10; return 0; }
CUresult cuCtxSetCurrent(void *ctx) {
  if (ctx != (void *)0x10) return 1;
  current = ctx;
  return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return 0; }
CUresult cuStreamCreate(void **s, unsigned flags) { NEED_CONTEXT; *s = (void *)0x20; return 0; }
CUresult cuStreamDestroy_v2(void *s) { NEED_CONTEXT; return s == (void *)0x20 ? 0 : 1; }
CUresult cuStreamSynchronize(void *s) { NEED_CONTEXT; return s == (void *)0x20 ? 0 : 1; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CONTEXT;
  *p = (CUdeviceptr)(uintptr_t)malloc(n);
  return *p ? 0 : 2;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CONTEXT;
  free((void *)(uintptr_t)p);
  return 0;
}
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void *s) {
  memset((void *)(uintptr_t)p, v, n);
  return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
  NEED_CONTEXT;
  memcpy((void *)(uintptr_t)d, h, n);
  return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
  NEED_CONTEXT;
  memcpy(h, (void *)(uintptr_t)d, n);
  return 0;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, void *s) {
  memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)src, n);
  return 0;
}

CUresult cuModuleLoadData(void **m, const void *image) {
  NEED_CONTEXT;
  *m = (void *)0x30;
  return ((const char *)image)[0] == 0x7f ? 0 : 200; /* a cubin (ELF) */
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  if (strcmp(name, "fake_scale_add") != 0) return 500;
  *f = (void *)"fake_scale_add";
  return 0;
}
CUresult cuModuleUnload(void *m) { NEED_CONTEXT; return m == (void *)0x30 ? 0 : 1; }
CUresult cuFuncSetAttribute(void *f, int attr, int v) { return 0; }

static void run(const Launch *l) {
  float *x = *(float **)l->params[0];
  int64_t n = *(int64_t *)l->params[1];
  float s = *(float *)l->params[2];
  for (int64_t i = 0; i < n; i++) x[i] = x[i] * s + 1.0f;
  fake_launches++;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  NEED_CONTEXT;
  if (stream != (void *)0x20 || extra != NULL || bx * by * bz != 128) return 1;
  Launch l = {(const char *)f, {gx, gy, gz}, {bx, by, bz}, shared, params};
  if (capturing >= 0) {
    if (capturing == MAX_LAUNCHES) return 2;
    capture[capturing++] = l;
  } else {
    run(&l);
  }
  return 0;
}

CUresult cuStreamBeginCapture_v2(void *s, int mode) {
  NEED_CONTEXT;
  if (capturing >= 0) return 1;
  capturing = 0;
  return 0;
}
CUresult cuStreamEndCapture(void *s, void **graph) {
  if (num_graphs == MAX_GRAPHS) return 2;
  Launch *nodes = malloc(sizeof(Launch) * (capturing + 1));
  memcpy(nodes, capture, sizeof(Launch) * capturing);
  graphs[num_graphs] = nodes;
  graph_sizes[num_graphs] = capturing;
  *graph = (void *)(uintptr_t)(num_graphs++ + 1);
  capturing = -1;
  return 0;
}
CUresult cuGraphInstantiateWithFlags(void **exe, void *graph, unsigned long long flags) {
  *exe = graph;
  return 0;
}
CUresult cuGraphDestroy(void *graph) { return 0; }
CUresult cuGraphExecDestroy(void *exe) {
  int g = (int)(uintptr_t)exe - 1;
  if (g < 0 || g >= num_graphs || graphs[g] == NULL) return 400;
  free(graphs[g]);
  graphs[g] = NULL;
  return 0;
}
CUresult cuGraphLaunch(void *exe, void *stream) {
  NEED_CONTEXT;
  int g = (int)(uintptr_t)exe - 1;
  if (g < 0 || g >= num_graphs || graphs[g] == NULL) return 400; /* invalid handle */
  for (int i = 0; i < graph_sizes[g]; i++) run(&graphs[g][i]);
  fake_graph_launches++;
  return 0;
}
