"""Issue #29's device check: all-MiniLM-L6-v2 (q8f32_1) on a real GPU's CUDA kernels, for
correctness against sentence-transformers and wick's CPU kernels, and sentences/s beside a
PyTorch peer on the same GPU.

    python bench/gpu_embed.py record [--out build/gpu/embed]     # here: artifact + references
    python bench/gpu_embed.py check [--device cuda] [--sizes 1 32 256]
                                    [--peer auto|transformers|torch|all|none] [--json FILE]
    bash bench/gpu_device.sh embed [check options]               # on the GPU machine
    bash bench/gpu_session.sh embed                               # ... as a session stage

``record`` (here: TVM, sentence-transformers, the model's weights) compiles the built-in model
as q8f32_1 into ``--out``, copies its config.json, and writes reference.json: the probe
sentences (of very different lengths), their token ids (without special tokens, from
sentence-transformers' own tokenizer), sentence-transformers' float32 vectors, and wick's
vectors on this machine's CPU kernels from the same artifact. It also checks that this file's
hand-written PyTorch encoder (the peer where ``transformers`` is missing) computes BERT: with
the real weights loaded, its vectors must match sentence-transformers'.

``check`` (the GPU machine: numpy, torch, the carried wheels; no TVM, no transformers needed)
loads the artifact on ``--device`` and

1. correctness: each probe alone, all of them in one request (mixed lengths), the same request
   as token ids, and that request twice more (on CUDA the third run of a step's launch list
   replays a captured CUDA graph): cosine to sentence-transformers (>= 0.999 for q8), cosine
   and max |difference| to wick-CPU, batch == one at a time, ids == text, replay == first;
2. speed: sentences/s for ``--sizes`` inputs of about 20 tokens (bench/embeddings.py's
   ``sentences()``), best of 3 after a warm call; wick with text input (its tokenizing
   counted) and with token ids; then the peer on the same device: ``transformers.BertModel``
   (random weights from the carried config, SDPA attention) where importable, else the
   hand-written encoder below, fp32 (and fp16 on CUDA), eval, no_grad, one padded batch with
   its attention mask, mean pooling + L2 normalize. The peer's tokenizing and padding happen
   before timing (not counted); its host->device copy of the ids and the read-back of the
   vectors are counted, as wick's are.

Prints PASS/FAIL per check and a markdown table, writes everything to ``--json`` (after each
part, so a stage cut off by its time limit still leaves the first). Exit status: 1 when a
correctness check fails, 2 when only the speed part failed, else 0.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from embeddings import best_rate, cosines, sentences  # noqa: E402  (bench/embeddings.py)
from gpu import import_wick_from_tree  # noqa: E402

MODEL = "all-minilm-l6-v2"
QUANT = "q8f32_1"
ARTIFACT = f"{MODEL}-{QUANT}"
REFERENCE = "reference.json"
SIZES = (1, 32, 256)

# from one word to ~200 tokens (the artifact's longest input is 256 with [CLS] and [SEP], where
# sentence-transformers' max_seq_length also is: neither truncates these)
PROBE = [
    "Hello.",
    "GPUs multiply matrices.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Résumé: naïve café owners in Zürich bought 3,141 croissants for €2.50 each!?",
    "How do I reset my password if I no longer have access to the email address on my "
    "account? I tried the recovery form twice and got no message.",
    "def add(a, b):\n    return a + b  # a tiny Python function, with code tokens",
    " ".join(["Embeddings map text to vectors so that sentences with similar meaning lie close "
              "together, which is what search, clustering and retrieval-augmented generation "
              "rely on."] * 3),
    " ".join(["A lighthouse keeper wrote in his log every evening: the wind, the ships that "
              "passed, the colour of the sea, and whether the lamp had needed trimming."] * 5),
]

# pass limits: q8 against float32 weights; the same artifact on two kernel sets (float32 sums in
# another order); the same kernels on other batches (per-row work: expected bit-equal or close)
MIN_COS_ST = 0.999
MIN_COS_CPU = 0.99999
MAX_DIFF_CPU = 1e-4
MAX_DIFF_SAME = 1e-5


def f32_b64(rows) -> list[str]:
    import numpy as np

    return [base64.b64encode(np.asarray(r, dtype="<f4").tobytes()).decode() for r in rows]


def from_b64(rows: list[str]):
    import numpy as np

    return np.stack([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows]).astype(
        np.float64)


def embed(engine, inputs) -> "np.ndarray":  # noqa: F821
    import numpy as np

    data = engine.embeddings.create(input=inputs).data
    return np.array([d.embedding for d in data], dtype=np.float64)


def max_diff(a, b) -> float:
    import numpy as np

    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def close_engine(engine) -> None:
    """Free the device (the peer, next, gets the GPU's memory)."""
    backend = engine.core.runner.backend
    if hasattr(backend, "close"):
        backend.close()


# ----------------------------------------------------------------------------- the peers


def bert_shape(config: dict) -> dict:
    return {"vocab": config["vocab_size"], "hidden": config["hidden_size"],
            "layers": config["num_hidden_layers"], "heads": config["num_attention_heads"],
            "intermediate": config["intermediate_size"],
            "positions": config["max_position_embeddings"],
            "types": config.get("type_vocab_size", 2), "eps": config.get("layer_norm_eps", 1e-12)}


def torch_bert(config: dict):
    """A BERT encoder in plain PyTorch (HF BertModel's math: post-norm layers, exact GELU),
    attention by ``scaled_dot_product_attention`` with the padding mask; returns the last
    hidden states. Random weights unless ``load_hf`` fills them."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    s = bert_shape(config)
    heads, head_dim = s["heads"], s["hidden"] // s["heads"]

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = s["hidden"]
            self.qkv = nn.Linear(h, 3 * h)  # (q, k and v in one GEMM)
            self.out = nn.Linear(h, h)
            self.ln1 = nn.LayerNorm(h, eps=s["eps"])
            self.up = nn.Linear(h, s["intermediate"])
            self.down = nn.Linear(s["intermediate"], h)
            self.ln2 = nn.LayerNorm(h, eps=s["eps"])

        def forward(self, x, keep):
            b, t, h = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, t, h)))
            return self.ln2(x + self.down(F.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = nn.Embedding(s["vocab"], s["hidden"])
            self.positions = nn.Embedding(s["positions"], s["hidden"])
            self.types = nn.Embedding(s["types"], s["hidden"])
            self.ln = nn.LayerNorm(s["hidden"], eps=s["eps"])
            self.layers = nn.ModuleList(Layer() for _ in range(s["layers"]))

        def forward(self, ids, mask):
            t = ids.shape[1]
            x = self.words(ids) + self.positions.weight[:t] + self.types.weight[0]
            x = self.ln(x)
            keep = mask[:, None, None, :].bool()  # (b, 1, 1, t): padded keys masked out
            for layer in self.layers:
                x = layer(x, keep)
            return x

    return Encoder()


def load_hf(encoder, state: dict) -> None:
    """HF BertModel's weights into ``torch_bert``'s names (record's self-check)."""
    import torch

    state = {k.removeprefix("bert."): v for k, v in state.items()}
    ours = {"words.weight": state["embeddings.word_embeddings.weight"],
            "positions.weight": state["embeddings.position_embeddings.weight"],
            "types.weight": state["embeddings.token_type_embeddings.weight"],
            "ln.weight": state["embeddings.LayerNorm.weight"],
            "ln.bias": state["embeddings.LayerNorm.bias"]}
    for i in range(len(encoder.layers)):
        hf, me = f"encoder.layer.{i}.", f"layers.{i}."
        for part in ("weight", "bias"):
            ours[me + "qkv." + part] = torch.cat(
                [state[f"{hf}attention.self.{n}.{part}"] for n in ("query", "key", "value")])
            ours[me + "out." + part] = state[f"{hf}attention.output.dense.{part}"]
            ours[me + "ln1." + part] = state[f"{hf}attention.output.LayerNorm.{part}"]
            ours[me + "up." + part] = state[f"{hf}intermediate.dense.{part}"]
            ours[me + "down." + part] = state[f"{hf}output.dense.{part}"]
            ours[me + "ln2." + part] = state[f"{hf}output.LayerNorm.{part}"]
    encoder.load_state_dict(ours)


def transformers_bert(config: dict):
    """``transformers.BertModel`` with random weights (no pooler), SDPA attention; returns the
    last hidden states like ``torch_bert``."""
    import torch.nn as nn
    from transformers import BertConfig, BertModel

    cfg = BertConfig.from_dict({k: v for k, v in config.items() if not k.startswith("_")})
    cfg._attn_implementation = "sdpa"  # (a constructor argument in some versions, not all)
    model = BertModel(cfg, add_pooling_layer=False)

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    return Hidden()


def padded(batch: list[list[int]]):
    """Token ids padded to the batch's longest (pad id 0) and their attention mask, on the
    host (built before timing)."""
    import torch

    longest = max(len(ids) for ids in batch)
    ids = torch.zeros((len(batch), longest), dtype=torch.long)
    mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return ids, mask


def pooled(model, ids, mask, device: str):
    """Mean over each input's own tokens, L2-normalized (sentence-transformers' Pooling +
    Normalize), read back to the host as float32."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        ids, mask = ids.to(device), mask.to(device)
        hidden = model(ids, mask)
        m = mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        return F.normalize(mean.float(), p=2, dim=1).cpu()


def peer_kinds(choice: str) -> list[str]:
    if choice == "none":
        return []
    if choice in ("torch", "transformers"):
        return [choice]
    try:
        import transformers  # noqa: F401
        have = True
    except ImportError:
        have = False
    if choice == "all":
        return ["transformers", "torch"] if have else ["torch"]
    return ["transformers" if have else "torch"]


def bench_peer(kind: str, config: dict, batches: dict[int, list[list[int]]], device: str,
               dtypes: list[str]) -> dict[str, dict[int, float]]:
    """sentences/s of the peer ``kind`` for each size's batch, per dtype."""
    import torch

    rows: dict[str, dict[int, float]] = {}
    for dtype in dtypes:
        torch.manual_seed(0)
        model = (transformers_bert if kind == "transformers" else torch_bert)(config)
        model = model.eval().to(device=device, dtype=getattr(torch, dtype))
        label = f"peer {'transformers.BertModel' if kind == 'transformers' else 'torch BERT'} " \
                f"{'fp32' if dtype == 'float32' else 'fp16'}"
        rows[label] = {}
        for n, batch in batches.items():
            ids, mask = padded(batch)

            def run(ids=ids, mask=mask):
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                out = pooled(model, ids, mask, device)  # (.cpu() waits for the GPU)
                if not torch.isfinite(out).all():
                    raise RuntimeError(f"{label}: non-finite vectors")

            rows[label][n] = best_rate(run, n)
            print(f"  {label}, {n} inputs: {rows[label][n]:.1f}/s", flush=True)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- record (here)


def record(out: Path) -> int:
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    from wick.compiler.compile import compile_model
    from wick.compiler.sources import resolve_source
    from wick.server.local import Engine

    source = resolve_source(MODEL).path
    out.mkdir(parents=True, exist_ok=True)
    art = compile_model(MODEL, QUANT, output=out / ARTIFACT)
    config = json.loads((source / "config.json").read_text())
    shutil.copy(source / "config.json", out / "config.json")

    st = SentenceTransformer(str(source), device="cpu")
    st_vecs = st.encode(PROBE, convert_to_numpy=True)
    ids = [st.tokenizer(s, add_special_tokens=False)["input_ids"] for s in PROBE]
    engine = Engine(str(art), device="cpu")
    cpu_vecs = embed(engine, PROBE)
    cpu_name = engine.device_name
    close_engine(engine)
    cos_cpu = cosines(cpu_vecs, st_vecs)

    # the hand-written peer, real weights: it must compute what sentence-transformers does
    encoder = torch_bert(config).eval()
    load_hf(encoder, load_file(str(source / "model.safetensors")))
    full = [[st.tokenizer.cls_token_id] + row + [st.tokenizer.sep_token_id] for row in ids]
    peer_vecs = pooled(encoder, *padded(full), "cpu").numpy()
    cos_peer = cosines(peer_vecs, st_vecs)

    lengths = [len(row) + 2 for row in ids]
    (out / REFERENCE).write_text(json.dumps({
        "model": MODEL, "quantization": QUANT, "sentences": PROBE, "token_ids": ids,
        "tokens": lengths, "sentence_transformers": f32_b64(st_vecs),
        "wick_cpu": f32_b64(cpu_vecs), "wick_cpu_device": cpu_name,
        "cos_wick_cpu_to_st": cos_cpu, "cos_torch_bert_to_st": cos_peer}))
    print(f"{art}: tokens per probe {lengths}")
    print(f"wick on {cpu_name}: cosine to sentence-transformers {cos_cpu:.6f}")
    print(f"hand-written torch BERT (real weights): cosine to sentence-transformers "
          f"{cos_peer:.7f}")
    ok = cos_cpu >= MIN_COS_ST and cos_peer >= 0.99999 and np.isfinite(cpu_vecs).all()
    print("record:", "ok" if ok else "FAILED")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- check (device)


def correctness(engine, ref: dict) -> dict:
    """Every check as {value, limit, ok}, printed as it is made."""
    import numpy as np

    st, cpu = from_b64(ref["sentence_transformers"]), from_b64(ref["wick_cpu"])
    texts = ref["sentences"]
    single = np.concatenate([embed(engine, t) for t in texts])
    batch = embed(engine, texts)
    ids = embed(engine, ref["token_ids"])
    again = [embed(engine, texts) for _ in range(2)]  # (the third run: a CUDA graph's replay)
    checks: dict[str, dict] = {}

    def check(name: str, value: float, limit: float, at_least: bool) -> None:
        ok = bool(math.isfinite(value) and (value >= limit if at_least else value <= limit))
        checks[name] = {"value": value, "limit": limit, "ok": ok}
        sign = ">=" if at_least else "<="
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {value:.7g} (want {sign} {limit:g})",
              flush=True)

    check("finite vectors", float(np.isfinite(np.stack([single, batch, ids])).all()), 1, True)
    check("cosine to sentence-transformers (min of probes)", cosines(batch, st), MIN_COS_ST,
          True)
    check("cosine to wick-CPU (min)", cosines(batch, cpu), MIN_COS_CPU, True)
    check("max |diff| to wick-CPU", max_diff(batch, cpu), MAX_DIFF_CPU, False)
    check("max |diff| one request of mixed lengths vs one at a time", max_diff(batch, single),
          MAX_DIFF_SAME, False)
    check("max |diff| token-id input vs text input", max_diff(ids, batch), MAX_DIFF_SAME, False)
    check("max |diff| repeated request (graph replay) vs first",
          max(max_diff(a, batch) for a in again), MAX_DIFF_SAME, False)
    per = {"cos_st": [cosines(batch[i:i + 1], st[i:i + 1]) for i in range(len(texts))],
           "diff_cpu": [max_diff(batch[i], cpu[i]) for i in range(len(texts))]}
    print("  per probe (tokens, cosine to s-t, max |diff| to wick-CPU): " + ", ".join(
        f"({t}, {c:.5f}, {d:.1e})" for t, c, d in zip(ref["tokens"], per["cos_st"],
                                                      per["diff_cpu"])), flush=True)
    rel = max_diff(batch, cpu) / float(np.abs(cpu).max())
    print(f"  max |diff| to wick-CPU relative to its largest value: {rel:.2e}")
    return {"checks": checks, "per_probe": per, "relative_diff_cpu": rel,
            "passed": all(c["ok"] for c in checks.values())}


def wick_speed(engine, sizes: list[int]) -> dict[str, dict[int, float]]:
    tok = engine.core.tokenizer
    rows: dict[str, dict[int, float]] = {f"wick {QUANT} (text)": {}, f"wick {QUANT} (ids)": {}}
    for n in sizes:
        texts = sentences(n)
        ids = [tok.encode(t) for t in texts]  # (special tokens: the engine adds them)
        rows[f"wick {QUANT} (text)"][n] = best_rate(
            lambda: engine.embeddings.create(input=texts), n)
        rows[f"wick {QUANT} (ids)"][n] = best_rate(
            lambda: engine.embeddings.create(input=ids), n)
        print(f"  wick, {n} inputs: text {rows[f'wick {QUANT} (text)'][n]:.1f}/s, ids "
              f"{rows[f'wick {QUANT} (ids)'][n]:.1f}/s", flush=True)
    return rows


def peer_batches(engine, sizes: list[int]) -> dict[int, list[list[int]]]:
    """Each size's inputs as the engine would embed them (special tokens added, same
    tokenizer): the peer gets the same tokens as wick."""
    from wick.engine.embeddings import EmbeddingRequest, input_ids

    core = engine.core
    most = min(core.info.embedding["max_input_tokens"], core.scheduler.prefill_chunk_size)
    return {n: input_ids(EmbeddingRequest(input=sentences(n)), core.tokenizer, core.info, most)
            for n in sizes}


def table(rows: dict[str, dict[int, float]], sizes: list[int], title: str) -> str:
    lines = [title, "", "| sentences/s | " + " | ".join(f"{n} inputs" for n in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for label, rates in rows.items():
        lines.append(f"| {label} | " + " | ".join(
            f"{rates[n]:.1f}" if n in rates else "-" for n in sizes) + " |")
    wick = rows.get(f"wick {QUANT} (text)", {})
    for label, rates in rows.items():
        if label.startswith("peer") and wick:
            lines.append(f"| wick (text) / {label.removeprefix('peer ')} | " + " | ".join(
                f"{wick[n] / rates[n]:.2f}x" if n in rates and n in wick else "-"
                for n in sizes) + " |")
    return "\n".join(lines)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return device


def check(args) -> int:
    from wick.server.local import Engine

    root = Path(args.artifacts)
    ref = json.loads((root / REFERENCE).read_text())
    config = json.loads((root / "config.json").read_text())
    report: dict = {"device": args.device, "artifact": str(root / ARTIFACT)}

    def save() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))

    t0 = time.perf_counter()
    try:  # (on CUDA: the driver, NVRTC's compile of kernels/cuda/kernels.cu, the weights)
        engine = Engine(str(root / ARTIFACT), device=args.device)
    except Exception as err:
        traceback.print_exc()
        report["correctness"] = {"passed": False, "error": f"load: {type(err).__name__}: {err}"}
        save()
        print(f"== FAILED: wick could not load {ARTIFACT} on {args.device}: {err}", flush=True)
        return 1
    report["backend"] = engine.device_name
    report["load_s"] = time.perf_counter() - t0
    print(f"== wick {ARTIFACT} on {engine.device_name} (loaded in {report['load_s']:.1f}s)",
          flush=True)
    print("== part 1: correctness", flush=True)
    try:
        report["correctness"] = correctness(engine, ref)
    except Exception as err:  # (reported as a failure; the speed part still runs)
        traceback.print_exc()
        report["correctness"] = {"passed": False, "error": f"{type(err).__name__}: {err}"}
    passed = report["correctness"]["passed"]
    print(f"== part 1: {'PASSED' if passed else 'FAILED'}", flush=True)
    save()

    print(f"== part 2: speed ({', '.join(map(str, args.sizes))} inputs of ~20 tokens)",
          flush=True)
    speed_ok = True
    rows: dict[str, dict[int, float]] = {}
    try:
        rows.update(wick_speed(engine, args.sizes))
        report["graph_launches"] = getattr(engine.core.runner.backend, "graph_launches", None)
        batches = peer_batches(engine, args.sizes)
        report["tokens_per_input"] = {n: sum(map(len, b)) / n for n, b in batches.items()}
    except Exception as err:
        traceback.print_exc()
        report["speed_error"] = f"wick: {type(err).__name__}: {err}"
        speed_ok, batches = False, {}
    close_engine(engine)
    del engine
    report["speed"] = rows
    save()
    peer_device = args.peer_device or ("cuda" if args.device.startswith("cuda") else "cpu")
    dtypes = ["float32", "float16"] if peer_device.startswith("cuda") else ["float32"]
    for kind in peer_kinds(args.peer) if batches else []:
        try:
            rows.update(bench_peer(kind, config, batches, peer_device, dtypes))
        except Exception as err:
            traceback.print_exc()
            report[f"peer_error_{kind}"] = f"{type(err).__name__}: {err}"
            speed_ok = False
        save()
    try:
        gpu = device_name(args.device)
    except Exception as err:  # (the name only)
        gpu = f"? ({err})"
    report["gpu"] = gpu
    title = (f"all-MiniLM-L6-v2 {QUANT}, sentences/s on {report['backend']} ({gpu}); "
             f"peer on {peer_device}, tokenizing not counted for it")
    print("\n" + table(rows, args.sizes, title), flush=True)
    report["speed_table"] = table(rows, args.sizes, title)
    save()
    print(f"\n== correctness {'PASSED' if passed else 'FAILED'}; speed "
          f"{'ok' if speed_ok else 'FAILED (see above)'}", flush=True)
    return 0 if passed and speed_ok else 1 if not passed else 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["record", "check"])
    p.add_argument("--out", "--artifacts", dest="artifacts",
                   default=str(ROOT / "build/gpu/embed"),
                   help="the artifact, config.json and reference.json (default build/gpu/embed)")
    p.add_argument("--device", default="cuda", help="check's wick device: cuda, vulkan, cpu")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--peer", choices=["auto", "transformers", "torch", "all", "none"],
                   default="auto", help="auto: transformers.BertModel if importable, else the "
                                        "hand-written torch encoder")
    p.add_argument("--peer-device", default=None, help="default: cuda for --device cuda, else cpu")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    import_wick_from_tree()
    if args.mode == "record":
        return record(Path(args.artifacts))
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
