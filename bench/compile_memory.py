"""How much memory compiling a model takes: a random Llama-shaped checkpoint in bf16
safetensors (no download; the shapes of a real model), compiled by ``wick compile`` in a child
process whose peak resident memory (getrusage) is printed beside the checkpoint's size.

    python bench/compile_memory.py [--shape 1b|3b|8b] [--quantization q4f16_1]
                                   [--kernel-sets webgpu]

The checkpoint is written once under build/bench-compile-memory/<shape> (1b: 1.7 GB, 3b:
6.4 GB, 8b: 16 GB of disk). Weights are read when they are written (compiler/lazy_weights.py),
so the peak is about one module's floats plus the kernel compiler's own, not the model's.
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# hidden, MLP width, layers, vocabulary, heads, key/value heads (TinyLlama-1.1B without its
# tied-off head; Llama-3.2-3B; Llama-3.1-8B)
SHAPES = {"1b": (2048, 5632, 16, 32000, 32, 4), "3b": (3072, 8192, 28, 128256, 24, 8),
          "8b": (4096, 14336, 32, 128256, 32, 8)}


def write_checkpoint(out: Path, shape: str) -> int:
    """A random bf16 checkpoint of ``shape`` (config, tokenizer, one safetensors file); its
    size in bytes. Written once."""
    weights = out / "model.safetensors"
    if weights.exists():
        return weights.stat().st_size
    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import byte_level_tokenizer

    hidden, width, layers, vocab, heads, kv_heads = SHAPES[shape]
    kv = kv_heads * hidden // heads
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": width, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    byte_level_tokenizer().save(str(out / "tokenizer.json"))
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (hidden, hidden),
                       p + "self_attn.k_proj.weight": (kv, hidden),
                       p + "self_attn.v_proj.weight": (kv, hidden),
                       p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (width, hidden),
                       p + "mlp.up_proj.weight": (width, hidden),
                       p + "mlp.down_proj.weight": (hidden, width),
                       p + "input_layernorm.weight": (hidden,),
                       p + "post_attention_layernorm.weight": (hidden,)})
    header, offset = {}, 0
    for name, dims in shapes.items():
        nbytes = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(0)
    partial = weights.with_suffix(".partial")
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, dims in shapes.items():
            if name.endswith("norm.weight"):
                values = np.ones(dims, np.float32)
            else:
                values = rng.standard_normal(dims, dtype=np.float32) * 0.02
            f.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    partial.rename(weights)
    return weights.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--quantization", default="q4f16_1")
    parser.add_argument("--kernel-sets", default="webgpu")
    args = parser.parse_args()
    source = ROOT / "build" / "bench-compile-memory" / args.shape
    size = write_checkpoint(source, args.shape)
    out = source.parent / f"{args.shape}-{args.quantization}"
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "wick"), "compile", str(source), "-q",
                    args.quantization, "--kernel-sets", args.kernel_sets, "-o", str(out),
                    "--force"], check=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # (KiB on Linux)
    print(f"\n{args.shape} Llama shape, bf16 checkpoint {size / 1e9:.2f} GB -> "
          f"{args.quantization} ({args.kernel_sets} kernels): peak resident memory "
          f"{peak / 1e9:.2f} GB ({peak / size:.2f}x the checkpoint), {seconds:.0f} s")


if __name__ == "__main__":
    main()
