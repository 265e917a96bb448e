// Compile the browser engine's Python sources to bytecode with Pyodide's own interpreter, so
// that a first start (no memory snapshot yet) imports them without compiling each module.
//
//   node wasm/bytecode.mjs PYODIDE_DIR SRC_DIR
//
// SRC_DIR (a directory of .py files, any depth) is mounted into Pyodide and compiled in
// place: each package gets __pycache__/NAME.cpython-3XX.pyc in Pyodide's own bytecode format
// (its magic number and cache tag, which the host's Python does not share). Unchecked-hash
// pycs: the interpreter uses them without comparing timestamps (a wheel's unpacked files carry
// the zip's fixed dates). Prints Pyodide's cache tag.
import path from "node:path";

const [pyodideDir, srcDir] = process.argv.slice(2);
const { loadPyodide } = await import(path.resolve(pyodideDir, "pyodide.mjs"));
const py = await loadPyodide({ indexURL: path.resolve(pyodideDir) + "/" });
py.FS.mkdir("/src");
py.FS.mount(py.FS.filesystems.NODEFS, { root: path.resolve(srcDir) }, "/src");
const tag = py.runPython(`
import compileall, py_compile, sys
ok = compileall.compile_dir("/src", quiet=1, workers=1,
                            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
if not ok:
    raise SystemExit("bytecode: a source did not compile")
sys.implementation.cache_tag
`);
console.log(tag);
