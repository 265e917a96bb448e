/**
 * The WebAssembly executor: the engine's Backend contract (engine/backend.py, kind "wasm") on
 * the CPU, for browsers without a usable WebGPU adapter. The twin of native/cpu_backend.py.
 *
 * - loadLibrary: instantiates the artifact's kernels.wasm (compiler/targets/wasm.py). The
 *   module's memory holds every buffer of the engine, so a kernel reads weights and writes
 *   activations in place (no copies between "device" and kernels).
 * - relaxed SIMD: where the browser validates it (Chrome 114+) and the artifact has them, it
 *   runs the modules compiled with it (kinds `wasm_relaxed` / `wasm_threads_relaxed`: each
 *   multiply and its add one fused `f32x4.relaxed_madd`), else the plain ones.
 * - threads: in a cross-origin isolated page (SharedArrayBuffer allowed) it runs
 *   kernels-threads.wasm over a shared memory instead, and starts one helper worker per extra
 *   core, each an instance of the same module over the same memory with its own stack, parked
 *   in wick_thread_main until a kernel's parallel loop hands it a task
 *   (compiler/kernel_runtime.c). Helpers join as they come up; until then loops run here.
 * - alloc/free/write: integer handles over 64-byte aligned blocks of the module's heap
 *   (wick_alloc / wick_free, compiler/kernel_runtime.c).
 * - runCalls: ONE call per engine step from Python: writes, then each kernel call with its
 *   tensors described as DLTensors in a scratch block, then the reads. Synchronous.
 *
 * Kernel ABI (TVM's packed convention on wasm32): `int f(self, args, nargs, result)`, `args`
 * an array of 16-byte TVMFFIAny {type_index i32 = 7 (DLTensor*), pad, value}, each pointing
 * at a 40-byte DLTensor {data, device {type 1 = CPU, id}, ndim, dtype {code u8, bits u8,
 * lanes u16}, shape*, strides* (null: compact), byte_offset u64}. Non-zero: the kernel's own
 * check failed; wick_error() holds its message.
 */

const ARG_BYTES = 16;
const TENSOR_BYTES = 40;
const FFI_DLTENSOR_PTR = 7;
const DEVICE_CPU = 1;
const ALIGN = 64;
const MAX_THREADS = 16; // (kernel_runtime.c's pool size)
const THREAD_STACK = 1 << 20;

/** A helper thread: instantiate the module over the shared memory, take its own stack, then
 * serve the pool forever (it is terminated with the executor). */
const THREAD_SOURCE = `onmessage = (e) => {
  const { module, memory, stackTop, index } = e.data;
  const ex = new WebAssembly.Instance(module, { env: { memory } }).exports;
  ex.__stack_pointer.value = stackTop;
  ex.wick_thread_main(index);
};`;

interface Exports {
  memory?: WebAssembly.Memory; // (exported by the one-thread module; the threaded one imports it)
  _initialize?: () => void;
  wick_init: () => void;
  wick_error: () => number;
  wick_alloc: (nbytes: number) => number;
  wick_free: (ptr: number) => void;
  [name: string]: unknown;
}

type Kernel = (self: number, args: number, nargs: number, result: number) => number;

interface LibraryEntry {
  sha256: string;
  functions: string[];
  export_prefix: string;
  threads: boolean;
  initial_memory?: number; // (bytes, threaded module: the memory it imports)
  max_memory?: number;
}

/** The manifest's WebAssembly kernel sets (engine/artifact.py `WASM_KINDS`). */
export type WasmLibrary = "wasm" | "wasm_threads" | "wasm_relaxed" | "wasm_threads_relaxed";

export class WasmExecutor {
  readonly features = ["shader-f16"]; // f16 variants run (each operation rounded through f32)
  readonly threads: number;
  // relaxed SIMD modules: the browser validates them, the engine's options allow them and the
  // artifacts loaded so far have them
  private relaxed: boolean;
  private ex: Exports | null = null;
  private memory: WebAssembly.Memory | null = null;
  private helpers: Worker[] = [];
  private kernels: { name: string; fn: Kernel; ms: number; calls: number }[] = [];
  private buffers = new Map<number, { ptr: number; size: number }>();
  private nextHandle = 1;
  private prepared = new Map<string, WebAssembly.Module>(); // compiled ahead, by sha256
  private scratch = 0; // argument block of a call
  private scratchCap = 0;
  steps = 0;
  callMs = 0; // milliseconds in kernels, summed over steps
  encodeMs = 0; // the rest of runCalls (descriptors, writes, reads): the WebGPU executor's name
  get waitMs(): number { return this.callMs; }

  constructor(threads: number, relaxedSimd: boolean) {
    this.threads = threads;
    this.relaxed = relaxedSimd;
  }

  get name(): string {
    const cores = (globalThis.navigator as Navigator | undefined)?.hardwareConcurrency;
    const threads = this.threads;
    return `wasm: WebAssembly ${this.relaxed ? "relaxed " : ""}SIMD (${threads} thread` +
      `${threads > 1 ? "s" : ""}${cores ? ` of ${cores} cores` : ""}` +
      `${threads > 1 ? "" : ", not cross-origin isolated"})`;
  }

  /** `maxThreads`: at most this many threads (the page's cores, when it may use them);
   * `relaxedSimd`: false keeps to the plain SIMD modules (createEngine's option). */
  static async create(maxThreads = MAX_THREADS, relaxedSimd = true): Promise<WasmExecutor> {
    if (typeof WebAssembly !== "object" || !WebAssembly.validate(SIMD_PROBE)) {
      throw Object.assign(new Error("this browser's WebAssembly lacks SIMD (Chrome 91+, Firefox 89+, " +
        "Safari 16.4+ have it)"), { wickCode: "no_wasm_simd" });
    }
    // threads need memory shared between workers: a cross-origin isolated page only
    // (and workers to start: a SharedWorker may have none)
    const shared = Boolean(globalThis.crossOriginIsolated) && typeof SharedArrayBuffer === "function" &&
      typeof Worker === "function";
    const cores = (globalThis.navigator as Navigator | undefined)?.hardwareConcurrency ?? 1;
    return new WasmExecutor(shared ? Math.max(1, Math.min(cores, maxThreads, MAX_THREADS)) : 1,
      relaxedSimd && WebAssembly.validate(RELAXED_SIMD_PROBE));
  }

  /** The manifest's kernel set this executor runs. */
  get library(): WasmLibrary { return this.libraries[0]; }

  /** The kernel sets this executor can run, the one it prefers first. */
  get libraries(): WasmLibrary[] {
    const plain = this.threads > 1 ? "wasm_threads" : "wasm";
    return this.relaxed ? [`${plain}_relaxed`, plain] : [plain];
  }

  /** Keep to the plain modules when an artifact has no relaxed ones (`kernelSets`: its
   * manifest's; compiled by an older wick, or exported without them). */
  fitLibrary(kernelSets: string[]): void {
    if (this.relaxed && !kernelSets.includes(this.library)) this.relaxed = false;
  }

  infoJson(): string {
    return JSON.stringify({
      name: this.name,
      kind: "wasm",
      library: this.library,
      fallback: false,
      features: this.features,
      threads: this.threads,
      // one wasm32 memory holds every buffer: 4 GiB in all
      maxStorageBufferBindingSize: 2 ** 31,
      maxBufferSize: 2 ** 31,
      minStorageBufferOffsetAlignment: ALIGN,
    });
  }

  /** Instantiate the kernel module (`entryJson`: its manifest entry); returns the index of
   * its first function. One library per executor: its memory is where this executor's
   * buffers live. Synchronous (a worker may compile a module of any size so), as the engine
   * assembles itself; helper threads start in the background. */
  loadLibrary(bytes: Uint8Array<ArrayBuffer>, entryJson: string): number {
    if (this.ex) throw new Error("this WebAssembly executor already holds a kernel library");
    const entry = JSON.parse(entryJson) as LibraryEntry;
    const module = this.prepared.get(entry.sha256) ?? new WebAssembly.Module(bytes);
    this.prepared.clear();
    let imports: WebAssembly.Imports = {};
    if (entry.threads) {
      this.memory = new WebAssembly.Memory({ initial: entry.initial_memory! / 65536,
        maximum: entry.max_memory! / 65536, shared: true });
      imports = { env: { memory: this.memory } };
    }
    const ex = new WebAssembly.Instance(module, imports).exports as unknown as Exports;
    this.memory ??= ex.memory!;
    ex._initialize?.();
    ex.wick_init();
    for (const name of entry.functions) {
      const fn = ex[entry.export_prefix + name];
      if (typeof fn !== "function") throw new Error(`function ${name} missing from the WebAssembly kernels`);
      this.kernels.push({ name, fn: fn as Kernel, ms: 0, calls: 0 });
    }
    this.ex = ex;
    this.growScratch(1 << 16);
    if (entry.threads) this.startHelpers(module);
    return 0;
  }

  /** Compile the kernel module `bytes` (verified: `sha256` is its hash) off this thread, so
   * that loadLibrary, which must be synchronous, finds it compiled: the worker starts this
   * while Python boots. */
  async prepare(sha256: string, bytes: Uint8Array<ArrayBuffer>): Promise<void> {
    this.prepared.set(sha256, await WebAssembly.compile(bytes));
  }

  /** One helper per extra thread. A helper that cannot start leaves the loops to the others
   * (the pool counts only helpers that are running). */
  private startHelpers(module: WebAssembly.Module): void {
    const url = URL.createObjectURL(new Blob([THREAD_SOURCE], { type: "text/javascript" }));
    try {
      for (let index = 1; index < this.threads; index++) {
        const stackTop = this.malloc(THREAD_STACK) + THREAD_STACK;
        const helper = new Worker(url, { name: `wick-wasm-${index}` });
        helper.onerror = (e) => console.error(`wick: WebAssembly helper thread ${index} failed: ${e.message}`);
        helper.postMessage({ module, memory: this.memory, stackTop, index });
        this.helpers.push(helper);
      }
    } catch (e) {
      console.warn(`wick: WebAssembly helper threads could not start (${(e as Error).message}); ` +
        `running on ${this.helpers.length + 1} thread(s)`);
    } finally {
      URL.revokeObjectURL(url);
    }
  }

  private get mod(): Exports {
    if (!this.ex) throw new Error("no kernel library loaded: buffers live in its memory");
    return this.ex;
  }

  // ------------------------------------------------------------------ allocator

  private malloc(nbytes: number): number {
    const ptr = this.mod.wick_alloc(nbytes) >>> 0;
    if (!ptr) {
      throw new Error(`out of memory allocating ${nbytes} bytes: a WebAssembly engine has 4 GiB ` +
        `for weights, KV cache and activations (${this.memory!.buffer.byteLength} in use)`);
    }
    return ptr;
  }

  alloc(nbytes: number): number {
    const size = Math.max(ALIGN, Math.ceil(nbytes / ALIGN) * ALIGN);
    const h = this.nextHandle++;
    this.buffers.set(h, { ptr: this.malloc(size), size });
    return h;
  }

  free(handle: number): void {
    const b = this.buffers.get(handle);
    if (!b) return;
    this.buffers.delete(handle);
    this.mod.wick_free(b.ptr);
  }

  write(handle: number, offset: number, data: Uint8Array): void {
    const b = this.buffer(handle);
    if (offset + data.byteLength > b.size) {
      throw new Error(`write of ${data.byteLength} bytes at ${offset} overflows buffer ${handle} of ${b.size}`);
    }
    new Uint8Array(this.memory!.buffer, b.ptr + offset, data.byteLength).set(data);
  }

  async drain(): Promise<void> {} // writes are done when write() returns

  async popErrors(): Promise<string> { return ""; } // errors are thrown where they happen

  private buffer(handle: number): { ptr: number; size: number } {
    const b = this.buffers.get(handle);
    if (!b) throw new Error(`buffer ${handle} is not allocated`);
    return b;
  }

  private growScratch(nbytes: number): void {
    if (nbytes <= this.scratchCap) return;
    if (this.scratch) this.mod.wick_free(this.scratch);
    this.scratchCap = Math.max(nbytes, 2 * this.scratchCap);
    this.scratch = this.malloc(this.scratchCap);
  }

  // ------------------------------------------------------------------ the step

  /** One engine step. `writeMeta`: (buffer, offset, length)* into `writeData`; `calls`:
   * (function, nargs, (buffer, offset, dtype, ndim, dim*ndim)*nargs)* with dtype the DLPack
   * word code | bits << 8 | lanes << 16; `reads`: (buffer, offset, size)*. Returns the read
   * bytes, each read at a 4-byte aligned position, in order. */
  runCalls(writeMeta: Int32Array, writeData: Uint8Array, calls: Int32Array, reads: Int32Array): Uint8Array {
    const t0 = performance.now();
    let pos = 0;
    for (let i = 0; i < writeMeta.length; i += 3) {
      const n = writeMeta[i + 2];
      this.write(writeMeta[i], writeMeta[i + 1], writeData.subarray(pos, pos + n));
      pos += n;
    }
    let inKernels = 0;
    for (let i = 0; i < calls.length;) {
      const fid = calls[i];
      const nargs = calls[i + 1];
      const kernel = this.kernels[fid];
      if (!kernel) throw new Error(`call of function ${fid}: only ${this.kernels.length} loaded`);
      // the call's block: args, then the DLTensors, then their shapes (int64)
      let need = nargs * (ARG_BYTES + TENSOR_BYTES);
      for (let j = 0, k = i + 2; j < nargs; j++) {
        need += 8 * calls[k + 3];
        k += 4 + calls[k + 3];
      }
      this.growScratch(need);
      const base = this.scratch;
      const view = new DataView(this.memory!.buffer);
      let shapes = base + nargs * (ARG_BYTES + TENSOR_BYTES);
      let k = i + 2;
      for (let j = 0; j < nargs; j++) {
        const b = this.buffer(calls[k]);
        const ndim = calls[k + 3];
        const arg = base + j * ARG_BYTES;
        const t = base + nargs * ARG_BYTES + j * TENSOR_BYTES;
        view.setInt32(arg, FFI_DLTENSOR_PTR, true);
        view.setInt32(arg + 4, 0, true);
        view.setUint32(arg + 8, t, true);
        view.setUint32(arg + 12, 0, true);
        view.setUint32(t, b.ptr + calls[k + 1], true); // data (offsets keep the plan's alignment)
        view.setInt32(t + 4, DEVICE_CPU, true);
        view.setInt32(t + 8, 0, true);
        view.setInt32(t + 12, ndim, true);
        view.setUint32(t + 16, calls[k + 2], true);
        view.setUint32(t + 20, shapes, true);
        view.setUint32(t + 24, 0, true); // strides: compact
        view.setBigUint64(t + 32, 0n, true);
        for (let d = 0; d < ndim; d++) view.setBigInt64(shapes + 8 * d, BigInt(calls[k + 4 + d]), true);
        shapes += 8 * ndim;
        k += 4 + ndim;
      }
      i = k;
      const c0 = performance.now();
      let rc: number;
      try {
        rc = kernel.fn(0, base, nargs, 0);
      } catch (e) { // a trap: out of bounds, unreachable
        throw new Error(`WebAssembly kernel ${kernel.name} trapped: ${(e as Error).message}`);
      }
      const ms = performance.now() - c0;
      inKernels += ms;
      kernel.ms += ms;
      kernel.calls++;
      if (rc !== 0) throw new Error(`WebAssembly kernel ${kernel.name} failed: ${this.lastError()}`);
    }
    let total = 0;
    for (let i = 0; i < reads.length; i += 3) total += Math.ceil(reads[i + 2] / 4) * 4;
    const out = new Uint8Array(total);
    const mem = new Uint8Array(this.memory!.buffer);
    for (let i = 0, at = 0; i < reads.length; i += 3) {
      const b = this.buffer(reads[i]);
      const start = b.ptr + reads[i + 1];
      out.set(mem.subarray(start, start + reads[i + 2]), at);
      at += Math.ceil(reads[i + 2] / 4) * 4;
    }
    this.steps++;
    this.callMs += inKernels;
    this.encodeMs += performance.now() - t0 - inKernels;
    return out;
  }

  /** Milliseconds spent in each kernel so far (the `top` slowest in total), and how many
   * tasks of parallel loops the helper threads ran, for benchmarks and tests. */
  profileJson(top = 12): string {
    const kernels = this.kernels.filter((k) => k.calls)
      .sort((a, b) => b.ms - a.ms).slice(0, top)
      .map((k) => ({ name: k.name, ms: k.ms, calls: k.calls }));
    const helperTasks = (this.ex?.wick_helper_tasks as (() => number) | undefined)?.() ?? 0;
    return JSON.stringify({ kernels, threads: this.threads, helperTasks });
  }

  private lastError(): string {
    const mem = new Uint8Array(this.memory!.buffer);
    const at = this.mod.wick_error() >>> 0;
    let end = at;
    while (mem[end] && end < at + 2048) end++;
    return new TextDecoder().decode(mem.slice(at, end)); // (a copy: shared memory cannot be decoded)
  }

  destroy(): void {
    for (const h of this.helpers) h.terminate();
    this.helpers = [];
    this.buffers.clear();
    this.kernels = [];
    this.ex = null; // the module and its memory go with the last reference
    this.memory = null;
  }
}

/** A module using one SIMD instruction (i8x16.splat): WebAssembly.validate() says whether
 * this browser has WebAssembly SIMD. */
const SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type: () -> v128
  0x03, 0x02, 0x01, 0x00, // function 0 of type 0
  0x0a, 0x08, 0x01, 0x06, 0x00, 0x41, 0x00, 0xfd, 0x0f, 0x0b, // body: i32.const 0; i8x16.splat; end
]);
// the same function returning f32x4.relaxed_madd of three such vectors
const RELAXED_SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b,
  0x03, 0x02, 0x01, 0x00,
  0x0a, 0x13, 0x01, 0x11, 0x00, 0x41, 0x00, 0xfd, 0x0f, 0x41, 0x00, 0xfd, 0x0f, 0x41, 0x00, 0xfd, 0x0f,
  0xfd, 0x85, 0x02, 0x0b, // f32x4.relaxed_madd; end
]);
