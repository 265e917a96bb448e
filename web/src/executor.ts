/**
 * The WebGPU executor: the browser's implementation of the engine's Backend contract
 * (engine/backend.py), the twin of native/wgpu_backend.py. It knows nothing about models.
 *
 * - load_kernels: one shader module, explicit bind group layout and pipeline per kernel, once.
 * - alloc/free/write: integer handles over GPUBuffers (STORAGE | COPY_SRC | COPY_DST).
 * - runStep: ONE call per engine step from Python, with flat typed arrays; writes, then one
 *   encoder and one compute pass for every dispatch (uniforms in one buffer at 256-aligned
 *   dynamic offsets, bind groups cached by their slices), reads copied into one MAP_READ
 *   staging buffer, one submit, mapAsync. Grids with x > maxComputeWorkgroupsPerDimension
 *   are folded into x*z exactly like fold_grid in native/wgpu_backend.py (docs/kernel-abi.md).
 */

export const UNIFORM_SLOT = 256;
export const OPTIONAL_FEATURES = ["shader-f16", "subgroups", "timestamp-query"] as const;

interface Program {
  name: string;
  pipeline: GPUComputePipeline;
  layout: GPUBindGroupLayout;
  nstorage: number;
  uniformSize: number; // bytes bound for the uniform, 0: none
}

interface KernelJson {
  name: string;
  wgsl: string;
  entry_point: string;
  storage_access: string[];
  uniform: boolean;
}

const roundUp = (n: number, m: number) => Math.ceil(n / m) * m;

/** (x', z) with x' * z >= x, exact whenever x has a factor z in range (see fold_grid). */
export function foldGrid(x: number, limit = 65535): [number, number] {
  if (x <= limit) return [x, 1];
  const zmin = Math.ceil(x / limit);
  const zmax = Math.min(limit, zmin + 4096);
  for (let z = zmin; z <= zmax; z++) if (x % z === 0) return [x / z, z];
  if (zmin > limit) throw new Error(`grid of ${x} workgroups exceeds ${limit} x ${limit}`);
  return [Math.ceil(x / zmin), zmin];
}

/** Bytes of the POD uniform the WGSL declares: 4 per field of the struct bound as uniform,
 * rounded up to 16 (at least 16). */
export function uniformSize(wgsl: string): number {
  const um = /@group\(0\)\s*@binding\(\d+\)\s*var<uniform>\s*\w+\s*:\s*(\w+)/.exec(wgsl);
  if (!um) return 0;
  const sm = new RegExp(`struct\\s+${um[1]}\\s*\\{([^}]*)\\}`).exec(wgsl);
  const fields = sm ? sm[1].split(",").filter((f) => f.includes(":")).length : 1;
  return Math.max(16, roundUp(4 * fields, 16));
}

export class Executor {
  readonly device: GPUDevice;
  readonly name: string;
  readonly features: string[];
  private programs: Program[] = [];
  private buffers = new Map<number, GPUBuffer>();
  private nextHandle = 1;
  private bindGroups = new Map<string, GPUBindGroup>();
  private uniform: GPUBuffer | null = null;
  private uniformCap = 0;
  private staging: GPUBuffer | null = null;
  private stagingCap = 0;
  // error scopes of load-time work (kernel compiles, allocations, weight writes), popped by
  // popErrors(): what failed, and its scope
  private errors: { what: string; scope: Promise<GPUError | null> }[] = [];
  private lost: string | null = null;
  steps = 0;
  // host-side milliseconds summed over steps: JS encoding (runStep up to submit) and waiting
  // for the device and the readback (submit to mapped bytes)
  encodeMs = 0;
  waitMs = 0;

  private constructor(device: GPUDevice, name: string) {
    this.device = device;
    this.name = name;
    this.features = OPTIONAL_FEATURES.filter((f) => device.features.has(f));
    device.lost.then((info) => {
      this.lost = `device lost: ${info.message}`;
    });
    this.growUniform(64 * UNIFORM_SLOT);
    this.growStaging(4096);
  }

  /** The best adapter and a device with every optional feature it has and its max limits.
   * Throws a plain Error with `.wickCode` "no_webgpu" | "no_adapter" for the caller to type. */
  static async create(): Promise<Executor> {
    const gpu = (globalThis.navigator as Navigator | undefined)?.gpu;
    if (!gpu) {
      throw Object.assign(new Error("WebGPU is not available in this browser (navigator.gpu is missing)"),
        { wickCode: "no_webgpu" });
    }
    const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) {
      throw Object.assign(new Error("WebGPU is present but no GPU adapter is available"),
        { wickCode: "no_adapter" });
    }
    const requiredFeatures = OPTIONAL_FEATURES.filter((f) => adapter.features.has(f)) as GPUFeatureName[];
    const lim = adapter.limits;
    const requiredLimits: Record<string, number> = {
      maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
      maxBufferSize: lim.maxBufferSize,
      maxComputeWorkgroupStorageSize: lim.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: lim.maxComputeInvocationsPerWorkgroup,
      maxComputeWorkgroupSizeX: lim.maxComputeWorkgroupSizeX,
      maxComputeWorkgroupSizeY: lim.maxComputeWorkgroupSizeY,
      maxComputeWorkgroupSizeZ: lim.maxComputeWorkgroupSizeZ,
      maxStorageBuffersPerShaderStage: lim.maxStorageBuffersPerShaderStage,
    };
    const device = await adapter.requestDevice({ requiredFeatures, requiredLimits, label: "wick" });
    const info = adapter.info;
    const name = `webgpu: ${info?.description || info?.device || info?.vendor || "adapter"}` +
      `${info?.architecture ? ` (${info.architecture})` : ""}`;
    const ex = new Executor(device, name);
    // a CPU implementation (SwiftShader): "auto" prefers the WebAssembly kernels to it
    ex.fallback = Boolean((info as { isFallbackAdapter?: boolean } | undefined)?.isFallbackAdapter ??
      (adapter as unknown as { isFallbackAdapter?: boolean }).isFallbackAdapter);
    return ex;
  }

  fallback = false;

  infoJson(): string {
    const l = this.device.limits;
    return JSON.stringify({
      name: this.name,
      fallback: this.fallback,
      features: this.features,
      maxStorageBufferBindingSize: l.maxStorageBufferBindingSize,
      maxBufferSize: l.maxBufferSize,
      minStorageBufferOffsetAlignment: l.minStorageBufferOffsetAlignment,
      maxComputeWorkgroupsPerDimension: l.maxComputeWorkgroupsPerDimension,
    });
  }

  // ------------------------------------------------------------------ programs

  loadKernels(specsJson: string): number {
    const specs = JSON.parse(specsJson) as KernelJson[];
    const dev = this.device;
    const base = this.programs.length;
    for (const spec of specs) {
      dev.pushErrorScope("validation");
      const entries: GPUBindGroupLayoutEntry[] = spec.storage_access.map((acc, i) => ({
        binding: i,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type: acc === "read_write" ? "storage" : "read-only-storage" },
      }));
      const usize = spec.uniform ? uniformSize(spec.wgsl) || 16 : 0;
      if (spec.uniform) {
        entries.push({
          binding: spec.storage_access.length,
          visibility: GPUShaderStage.COMPUTE,
          buffer: { type: "uniform", hasDynamicOffset: true },
        });
      }
      const module = dev.createShaderModule({ label: spec.name, code: spec.wgsl });
      const layout = dev.createBindGroupLayout({ label: spec.name, entries });
      const pipeline = dev.createComputePipeline({
        label: spec.name,
        layout: dev.createPipelineLayout({ label: spec.name, bindGroupLayouts: [layout] }),
        compute: { module, entryPoint: spec.entry_point },
      });
      this.programs.push({ name: spec.name, pipeline, layout, nstorage: spec.storage_access.length,
        uniformSize: usize });
      this.errors.push({ what: `kernel ${spec.name}`, scope: dev.popErrorScope() });
    }
    return base;
  }

  /** The first asynchronous WebGPU error so far (kernel compile/validation), as text, or "". */
  async popErrors(): Promise<string> {
    const pending = this.errors.splice(0);
    for (const { what, scope } of pending) {
      let err: GPUError | null;
      try {
        err = await scope;
      } catch (e) { // the device is gone (e.g. the GPU process crashed compiling a kernel)
        return `the WebGPU device was lost during ${what} (${this.lost ?? (e as Error).message})`;
      }
      if (err) return `${what}: ${err.message}`;
    }
    return this.lost ?? "";
  }

  /** Run `f` inside validation and out-of-memory error scopes, kept for popErrors(). */
  private scoped<T>(what: string, f: () => T): T {
    const dev = this.device;
    dev.pushErrorScope("out-of-memory");
    dev.pushErrorScope("validation");
    try {
      return f();
    } finally {
      const validation = dev.popErrorScope();
      const oom = dev.popErrorScope();
      this.errors.push({ what, scope: validation }, { what, scope: oom });
    }
  }

  // ------------------------------------------------------------------ allocator

  alloc(nbytes: number): number {
    const size = Math.max(16, roundUp(nbytes, 16));
    if (size > this.device.limits.maxBufferSize) {
      throw new Error(`buffer of ${nbytes} bytes exceeds maxBufferSize ${this.device.limits.maxBufferSize}`);
    }
    const buf = this.scoped(`allocating ${nbytes} bytes`, () => this.device.createBuffer({
      size,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    }));
    const h = this.nextHandle++;
    this.buffers.set(h, buf);
    return h;
  }

  free(handle: number): void {
    const buf = this.buffers.get(handle);
    if (!buf) return;
    this.buffers.delete(handle);
    for (const key of [...this.bindGroups.keys()]) {
      if (key.split("|").slice(1).some((s) => s.split(",")[0] === String(handle))) this.bindGroups.delete(key);
    }
    buf.destroy();
  }

  /** A load-time upload (weights): its errors surface through popErrors(). */
  write(handle: number, offset: number, data: Uint8Array): void {
    this.scoped(`writing ${data.byteLength} bytes to buffer ${handle}`,
      () => this.writeBytes(handle, offset, data));
  }

  /** Resolves once the device has taken every write so far (bounds memory while loading). */
  async drain(): Promise<void> {
    await this.device.queue.onSubmittedWorkDone();
    if (this.lost) throw new Error(this.lost);
  }

  private writeBytes(handle: number, offset: number, data: Uint8Array): void {
    const buf = this.buffers.get(handle);
    if (!buf) throw new Error(`write to buffer ${handle}: not allocated`);
    if (!data.byteLength) return;
    if (data.byteLength % 4) {
      const padded = new Uint8Array(roundUp(data.byteLength, 4));
      padded.set(data);
      data = padded;
    }
    this.device.queue.writeBuffer(buf, offset, data.buffer, data.byteOffset, data.byteLength);
  }

  // ------------------------------------------------------------------ the step

  /** One engine step. `writeMeta`: (buffer, offset, length)* into `writeData`; `dispatches`:
   * (kernel, n, (buffer, offset, size)*n, uniformLen, gx, gy, gz)*; `uniforms`: their
   * concatenated uniform bytes; `reads`: (buffer, offset, size)*. Resolves to the read bytes,
   * each read at a 4-byte aligned position, in order. */
  async runStep(writeMeta: Int32Array, writeData: Uint8Array, dispatches: Int32Array,
                uniforms: Uint8Array, reads: Int32Array): Promise<Uint8Array> {
    if (this.lost) throw new Error(this.lost);
    const t0 = performance.now();
    let pos = 0;
    for (let i = 0; i < writeMeta.length; i += 3) {
      const n = writeMeta[i + 2];
      this.writeBytes(writeMeta[i], writeMeta[i + 1], writeData.subarray(pos, pos + n));
      pos += n;
    }
    const dev = this.device;
    // pass 1: uniform slots
    const offsets: number[] = [];
    let total = 0;
    for (let i = 0; i < dispatches.length;) {
      const prog = this.programs[dispatches[i]];
      if (!prog) throw new Error(`dispatch of kernel ${dispatches[i]}: only ${this.programs.length} loaded`);
      const n = dispatches[i + 1];
      offsets.push(total);
      total += roundUp(prog.uniformSize, UNIFORM_SLOT);
      i += 2 + 3 * n + 4;
    }
    if (total > this.uniformCap) this.growUniform(total);
    if (total) {
      const blob = new Uint8Array(total);
      let u = 0;
      let k = 0;
      for (let i = 0; i < dispatches.length; k++) {
        const n = dispatches[i + 1];
        const ulen = dispatches[i + 2 + 3 * n];
        blob.set(uniforms.subarray(u, u + ulen), offsets[k]);
        u += ulen;
        i += 2 + 3 * n + 4;
      }
      dev.queue.writeBuffer(this.uniform!, 0, blob);
    }
    const limit = dev.limits.maxComputeWorkgroupsPerDimension;
    const encoder = dev.createCommandEncoder();
    if (dispatches.length) {
      const pass = encoder.beginComputePass();
      let last = -1;
      let k = 0;
      for (let i = 0; i < dispatches.length; k++) {
        const kid = dispatches[i];
        const n = dispatches[i + 1];
        const slices = dispatches.subarray(i + 2, i + 2 + 3 * n);
        let [x, y, z] = [dispatches[i + 3 + 3 * n], dispatches[i + 4 + 3 * n], dispatches[i + 5 + 3 * n]];
        i += 2 + 3 * n + 4;
        const prog = this.programs[kid];
        if (kid !== last) {
          pass.setPipeline(prog.pipeline);
          last = kid;
        }
        pass.setBindGroup(0, this.bindGroup(kid, prog, slices), prog.uniformSize ? [offsets[k]] : []);
        if (x > limit || y > limit || z > limit) {
          if (y > limit || z !== 1) {
            throw new Error(`kernel ${prog.name}: grid (${x}, ${y}, ${z}) exceeds ${limit} per dimension and cannot be folded`);
          }
          [x, z] = foldGrid(x, limit);
        }
        pass.dispatchWorkgroups(x, y, z);
      }
      pass.end();
    }
    const spans: number[] = [];
    let rtotal = 0;
    for (let i = 0; i < reads.length; i += 3) {
      spans.push(rtotal);
      rtotal += roundUp(reads[i + 2], 4);
    }
    if (rtotal > this.stagingCap) this.growStaging(rtotal);
    for (let i = 0, k = 0; i < reads.length; i += 3, k++) {
      const buf = this.buffers.get(reads[i]);
      if (!buf) throw new Error(`read of buffer ${reads[i]}: not allocated`);
      if (reads[i + 2]) encoder.copyBufferToBuffer(buf, reads[i + 1], this.staging!, spans[k], roundUp(reads[i + 2], 4));
    }
    dev.queue.submit([encoder.finish()]);
    this.steps++;
    const t1 = performance.now();
    this.encodeMs += t1 - t0;
    if (!rtotal) return new Uint8Array(0);
    const staging = this.staging!;
    await staging.mapAsync(GPUMapMode.READ, 0, rtotal);
    try {
      return new Uint8Array(staging.getMappedRange(0, rtotal).slice(0));
    } finally {
      staging.unmap();
      this.waitMs += performance.now() - t1;
    }
  }

  private bindGroup(kid: number, prog: Program, slices: Int32Array): GPUBindGroup {
    const key = `${kid}|${Array.from({ length: slices.length / 3 }, (_, j) =>
      `${slices[3 * j]},${slices[3 * j + 1]},${slices[3 * j + 2]}`).join("|")}`;
    let bg = this.bindGroups.get(key);
    if (bg) return bg;
    if (slices.length / 3 !== prog.nstorage) {
      throw new Error(`kernel ${prog.name} takes ${prog.nstorage} buffers, got ${slices.length / 3}`);
    }
    const entries: GPUBindGroupEntry[] = [];
    for (let j = 0; j < prog.nstorage; j++) {
      const buf = this.buffers.get(slices[3 * j]);
      if (!buf) throw new Error(`kernel ${prog.name} binding ${j}: buffer ${slices[3 * j]} is not allocated`);
      entries.push({ binding: j, resource: { buffer: buf, offset: slices[3 * j + 1], size: slices[3 * j + 2] } });
    }
    if (prog.uniformSize) {
      entries.push({ binding: prog.nstorage, resource: { buffer: this.uniform!, offset: 0, size: prog.uniformSize } });
    }
    bg = this.device.createBindGroup({ label: prog.name, layout: prog.layout, entries });
    this.bindGroups.set(key, bg);
    return bg;
  }

  private growUniform(nbytes: number): void {
    const cap = Math.max(this.uniformCap * 2, roundUp(nbytes, UNIFORM_SLOT));
    this.uniform?.destroy();
    this.uniform = this.device.createBuffer({ label: "wick-uniforms", size: cap,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    this.uniformCap = cap;
    this.bindGroups.clear(); // they point at the old uniform buffer
  }

  private growStaging(nbytes: number): void {
    const cap = Math.max(this.stagingCap * 2, roundUp(nbytes, 256));
    this.staging?.destroy();
    this.staging = this.device.createBuffer({ label: "wick-readback", size: cap,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    this.stagingCap = cap;
  }

  destroy(): void {
    for (const b of this.buffers.values()) b.destroy();
    this.buffers.clear();
    this.uniform?.destroy();
    this.staging?.destroy();
    this.device.destroy();
  }
}
