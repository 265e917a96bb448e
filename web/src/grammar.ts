/**
 * xgrammar in the worker: @mlc-ai/web-xgrammar (the same version as the server's PyPI
 * xgrammar; the build pins both), loaded on the first request that needs a grammar. The
 * Python side (wasm/wick_web/grammar.py) drives it through the object `createGrammar` returns.
 *
 * web-xgrammar reports a refused schema or grammar by aborting the wasm call: the exception
 * only says "Aborted()", while the reason goes to `console.error` as "[FATAL] file.cc:N: why".
 * The module binds console.error when it first initializes, so a filter installed before that
 * keeps the last such line (and keeps xgrammar's log lines off the page's console); each call
 * rethrows the abort with that reason, which is what the server's xgrammar says too.
 */

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

let lastFatal = "";
let loading: Promise<Any> | null = null;

function loadXGrammar(url: string): Promise<Any> {
  if (!loading) {
    const original = console.error;
    console.error = (...args: unknown[]) => {
      const line = args.map(String).join(" ");
      if (line.startsWith("[FATAL]")) { lastFatal = line; return; }
      if (line.startsWith("[WARNING]")) return;
      original.apply(console, args);
    };
    loading = import(/* webpackIgnore: true */ url).then(() => (globalThis as Any).xgrammar);
  }
  return loading;
}

async function guarded<T>(call: () => Promise<T> | T): Promise<T> {
  lastFatal = "";
  try {
    return await call();
  } catch (e) {
    const reason = lastFatal || (e instanceof Error ? e.message : String(e));
    throw new Error(reason);
  }
}

const VOCAB_TYPES = ["raw", "byte_fallback", "byte_level"]; // engine/grammar.py's numbering

/** The grammar library for one model's vocabulary (what wick_web.grammar calls). */
export async function createGrammar(url: string, encodedVocab: string[], vocabType: number,
                                    addPrefixSpace: boolean, vocabSize: number,
                                    stopTokenIds: number[]): Promise<Any> {
  const xgr = await loadXGrammar(url);
  const info = await guarded(() => xgr.TokenizerInfo.createTokenizerInfo(
    encodedVocab, VOCAB_TYPES[vocabType], addPrefixSpace, vocabSize, stopTokenIds));
  const compiler = await guarded(() => xgr.GrammarCompiler.createGrammarCompiler(info));
  return {
    /** xgrammar's EBNF for a JSON schema (indent -1: one line). */
    async jsonSchemaEBNF(schema: string, anyWhitespace: boolean, indent: number,
                         strict: boolean): Promise<string> {
      const grammar = await guarded(() => xgr.Grammar.fromJSONSchema(
        schema, anyWhitespace, indent, undefined, strict));
      try { return grammar.toString(); } finally { grammar.dispose(); }
    },
    compileEBNF(ebnf: string): Promise<Any> {
      return guarded(() => compiler.compileGrammar(ebnf, "root"));
    },
    /** A structural tag (JSON text, xgrammar's format): how wick constrains tool calls. */
    compileStructuralTag(tag: string): Promise<Any> {
      return guarded(() => compiler.compileStructuralTag(tag));
    },
    matcher(compiled: Any): Promise<Any> {
      return guarded(() => xgr.GrammarMatcher.createGrammarMatcher(compiled));
    },
  };
}
