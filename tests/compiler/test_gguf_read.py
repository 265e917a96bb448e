"""compiler/gguf_read.py: the fast reader gives what ``gguf.GGUFReader`` gives, field by field and
tensor by tensor, in either byte order; ``open_gguf`` shares one reader per file version."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from wick.compiler.gguf_read import FastGGUFReader, open_gguf


def _write(path, endianess):
    w = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    w.add_block_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_bool("wick.test.flag", True)
    w.add_int64("wick.test.big", -(2 ** 40))
    w.add_string("wick.test.text", "héllo ☃")
    w.add_token_list(["<s>", "a", "ab", "▁b", "é", ""])
    w.add_token_types([3, 1, 1, 1, 1, 1])
    w.add_token_scores([0.0, -1.5, -2.25, -3.0, -4.0, -5.0])
    w.add_token_merges(["a b", "▁ b"])
    w.add_array("wick.test.u16", [1, 65535])
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((6, 32), dtype=np.float32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64), dtype=np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.arange(32, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _fields(reader):
    return {name: ([p.dtype.str for p in f.parts], [p.tobytes() for p in f.parts], f.data,
                   f.types, f.contents()) for name, f in reader.fields.items()}


def _tensors(reader):
    return [(t.name, t.tensor_type, t.shape.tolist(), t.n_elements, t.n_bytes, t.data_offset,
             t.data.dtype.str, t.data.shape, t.data.tobytes()) for t in reader.tensors]


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_the_fast_reader_reads_what_the_package_reads(tmp_path, endianess):
    path = tmp_path / "m.gguf"
    _write(path, endianess)
    ours, theirs = FastGGUFReader(path), gguf.GGUFReader(path)
    assert ours.byte_order == theirs.byte_order == ("I" if endianess == gguf.GGUFEndian.LITTLE
                                                    else "S")
    assert _fields(ours) == _fields(theirs)
    assert _tensors(ours) == _tensors(theirs)
    assert ours.data_offset == theirs.data_offset
    assert ours.fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a", "ab", "▁b", "é", ""]
    assert ours.fields["wick.test.big"].contents() == -(2 ** 40)
    assert ours.fields["llama.rope.freq_base"].contents() == 500000.0


def test_open_gguf_shares_a_reader_until_the_file_changes(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, gguf.GGUFEndian.LITTLE)
    first = open_gguf(path)
    assert open_gguf(str(path)) is first
    _write(path, gguf.GGUFEndian.LITTLE)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = open_gguf(path)
    assert second is not first and _fields(second) == _fields(first)
