// Calls one function of a wick WebAssembly kernel module (compiler/targets/wasm.py) under
// node, for the tests: `node wasm_call.mjs kernels.wasm spec.json`, where spec.json is
// {"function": name, "repeat": n, "args": [{"file", "dtype_word", "shape"}...]}. Each argument's
// bytes are read from its file, and written back to it after the call (outputs included);
// prints {"rc", "error", "ms"} (ms: the mean of `repeat` calls after one warm call).
// The argument layout is TVM's packed convention on wasm32, as web/src/wasm_executor.ts builds it.
import fs from "fs";

const [wasmPath, specPath] = process.argv.slice(2);
const spec = JSON.parse(fs.readFileSync(specPath, "utf8"));
const ex = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(wasmPath)), {}).exports;
ex._initialize?.();
ex.wick_init();
const n = spec.args.length;
const datas = spec.args.map((a) => fs.readFileSync(a.file));
const ptrs = datas.map((d) => ex.wick_alloc(Math.max(d.length, 1)) >>> 0);
const block = ex.wick_alloc(n * 56 + 8 * spec.args.reduce((s, a) => s + a.shape.length, 0)) >>> 0;
const mem = () => ex.memory.buffer;
datas.forEach((d, j) => new Uint8Array(mem(), ptrs[j], d.length).set(d));
const view = new DataView(mem());
let shapes = block + n * 56;
spec.args.forEach((a, j) => {
  const arg = block + 16 * j, t = block + 16 * n + 40 * j;
  view.setInt32(arg, 7, true); view.setInt32(arg + 4, 0, true);
  view.setUint32(arg + 8, t, true); view.setUint32(arg + 12, 0, true);
  view.setUint32(t, ptrs[j], true); view.setInt32(t + 4, 1, true); view.setInt32(t + 8, 0, true);
  view.setInt32(t + 12, a.shape.length, true); view.setUint32(t + 16, a.dtype_word, true);
  view.setUint32(t + 20, shapes, true); view.setUint32(t + 24, 0, true);
  view.setBigUint64(t + 32, 0n, true);
  a.shape.forEach((d, k) => view.setBigInt64(shapes + 8 * k, BigInt(d), true));
  shapes += 8 * a.shape.length;
});
const f = ex[(spec.export_prefix ?? "__tvm_ffi_") + spec.function];
let rc = f(0, block, n, 0);
let ms = 0;
if (rc === 0 && spec.repeat) {
  const t0 = performance.now();
  for (let i = 0; i < spec.repeat && rc === 0; i++) rc = f(0, block, n, 0);
  ms = (performance.now() - t0) / spec.repeat;
}
let error = "";
if (rc !== 0) {
  const m = new Uint8Array(mem());
  const at = ex.wick_error() >>> 0;
  let end = at;
  while (m[end]) end++;
  error = new TextDecoder().decode(m.subarray(at, end));
}
datas.forEach((d, j) => fs.writeFileSync(spec.args[j].file, new Uint8Array(mem(), ptrs[j], d.length)));
console.log(JSON.stringify({ rc, error, ms }));
