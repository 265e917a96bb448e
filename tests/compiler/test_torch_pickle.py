"""pytorch_model.bin read without torch (compiler/torch_pickle.py): every tensor equal to
torch.load's on the same file, and a pickle that names anything else refused before it runs."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest


def reference(file: Path) -> dict[str, np.ndarray]:
    import torch

    return {k: (v.float() if v.dtype == torch.bfloat16 else v).detach().numpy()
            for k, v in torch.load(file, weights_only=True).items()}


def test_every_dtype_view_and_shared_storage_equals_torch_load(tmp_path):
    import torch

    from wick.compiler import torch_pickle

    torch.manual_seed(0)
    base = torch.randn(6, 10)
    module = torch.nn.Linear(10, 6)  # (a module's state_dict: an OrderedDict with _metadata)
    state = OrderedDict(module.state_dict())
    state.update({
        "tied.embedding": base, "tied.head": base,  # one storage, two names
        "transposed": base.t(), "rows": base[2:5], "column": base[:, 3],  # strided views
        "bf16": torch.randn(4, 8).to(torch.bfloat16), "f16": torch.randn(3, 5).half(),
        "f64": torch.randn(2, 3, dtype=torch.float64), "i64": torch.arange(7),
        "i32": torch.arange(5, dtype=torch.int32), "mask": torch.tril(torch.ones(3, 3)).bool(),
        "scalar": torch.tensor(2.5), "param": torch.nn.Parameter(torch.randn(4)),
    })
    file = tmp_path / "pytorch_model.bin"
    torch.save(state, file)
    got = {name: (array, stored) for name, array, stored in torch_pickle.read(file)}
    expected = reference(file)
    assert got.keys() == expected.keys() and torch_pickle.count(file) == len(expected)
    for name, want in expected.items():
        array, _ = got[name]
        assert array.dtype == want.dtype and array.shape == want.shape, name
        assert array.flags.c_contiguous
        np.testing.assert_array_equal(array, want, err_msg=name)
    stored = {name: s for name, (_, s) in got.items()}
    assert (stored["bf16"], stored["f16"], stored["tied.head"], stored["i64"], stored["mask"]
            ) == ("BF16", "F16", "F32", "I64", "BOOL")
    assert got["bf16"][0].dtype == np.float32  # (bf16 widened exactly, as hf_source does)


class RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload", ["in_the_dict", "whole_file"])
def test_a_pickle_naming_other_code_is_refused_and_nothing_runs(tmp_path, payload):
    import torch

    from wick.compiler import torch_pickle

    marker = tmp_path / "ran"
    evil = RunsACommand(marker)
    obj = {"weight": torch.ones(2), "x": evil} if payload == "in_the_dict" else evil
    file = tmp_path / "pytorch_model.bin"
    torch.save(obj, file)
    with pytest.raises(torch_pickle.TorchPickleError, match=r"names (posix|os)\.system.*refused"):
        list(torch_pickle.read(file))
    assert not marker.exists()


def test_other_files_get_a_clear_error(tmp_path):
    import torch

    from wick.compiler import torch_pickle

    legacy = tmp_path / "legacy.bin"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(torch_pickle.TorchPickleError, match="before 1.6.*safetensors"):
        list(torch_pickle.read(legacy))
    a_list = tmp_path / "list.bin"
    torch.save([torch.ones(2)], a_list)
    with pytest.raises(torch_pickle.TorchPickleError, match="not a state dict"):
        list(torch_pickle.read(a_list))
    wrapped = tmp_path / "training.bin"  # (a training checkpoint's {"state_dict": ...})
    torch.save({"state_dict": {"w": torch.arange(3.0)}, "epoch": 3}, wrapped)
    assert [(n, a.tolist()) for n, a, _ in torch_pickle.read(wrapped)] == [("w", [0.0, 1.0, 2.0])]


def test_an_hf_directory_of_bin_shards_loads_as_its_safetensors_twin(tmp_path):
    """The same tiny model as sharded pytorch_model-0000N-of-00002.bin files (with their index,
    as save_pretrained wrote them before safetensors): hf_source gives the arrays and stored
    dtypes its safetensors give, and the content hash covers the shards."""
    import torch
    from safetensors.torch import load_file

    from tests.tiny_models import make_tiny_model
    from wick.compiler import hf_source

    twin = make_tiny_model(tmp_path / "st", "llama", seed=3)
    old = make_tiny_model(tmp_path / "bin", "llama", seed=3)
    state = load_file(str(old / "model.safetensors"))
    (old / "model.safetensors").unlink()
    names = sorted(state)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    index = {}
    for number, shard in enumerate(shards, 1):
        file = f"pytorch_model-{number:05d}-of-00002.bin"
        torch.save({k: state[k].to(torch.bfloat16) for k in shard}, old / file)
        index.update({k: file for k in shard})
    (old / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": index}))
    (old / "training_args.bin").write_bytes(b"not weights")  # (a trainer's file: not read)
    (old / "pytorch_model.bin").write_bytes(b"stale")  # (beside the shards: not in the index)

    expected, _ = hf_source.load_weights(
        twin, hf_source.load_config(twin))
    reads = []
    got, dtypes = hf_source.load_weights(old, hf_source.load_config(old),
                                         lambda stage, done, total: reads.append((done, total)))
    assert got.keys() == expected.keys() and set(dtypes.values()) == {"BF16"}
    for name, want in expected.items():
        rounded = torch.from_numpy(np.asarray(want)).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(got[name], rounded, err_msg=name)
    assert reads[-1] == (len(names), len(names))
    assert [p.name for p in hf_source.weight_files(old)] == [
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    assert {p.name for p in hf_source.tracked_files(old)} >= {
        "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json"}
    (old / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(hf_source.HFDirError, match="shard pytorch_model-00002-of-00002.bin"):
        hf_source.weight_files(old)


def test_a_damaged_bin_is_one_clear_model_error(tmp_path):
    from tests.tiny_models import make_tiny_model
    from wick.compiler import hf_source

    path = make_tiny_model(tmp_path / "m", "llama")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(hf_source.HFDirError, match="pytorch_model.bin: .*torch's zip format"):
        hf_source.load_weights(path, hf_source.load_config(path))


def _zip_with(path: Path, entries: dict[str, bytes], compression=None) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression or zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def test_a_pickle_cannot_change_what_later_files_are_read_with(tmp_path):
    """A pickle may set attributes on what it names (BUILD): each lookup gets a fresh object,
    so a hostile file fails alone and the next checkpoint reads as before."""
    import torch

    from wick.compiler import torch_pickle

    # GLOBAL torch.FloatStorage; BUILD (None, {"name": "Evil"}): its name set via slot state
    hostile = (b"\x80\x02ctorch\nFloatStorage\nN}X\x04\x00\x00\x00name"
               b"X\x04\x00\x00\x00Evils\x86b.")
    bad = _zip_with(tmp_path / "bad.bin", {"archive/data.pkl": hostile})
    with pytest.raises(torch_pickle.TorchPickleError):
        list(torch_pickle.read(bad))
    good = tmp_path / "good.bin"
    torch.save({"w": torch.arange(4.0)}, good)
    assert [(n, a.tolist(), s) for n, a, s in torch_pickle.read(good)] == [
        ("w", [0.0, 1.0, 2.0, 3.0], "F32")]


def test_views_past_their_storage_and_compressed_storages_are_refused(tmp_path):
    """A view repeating one element 10^10 times (strides of 0) would allocate 37 GiB; a
    compressed entry could inflate to anything: both are refused before any allocation."""
    import zipfile

    import torch

    from wick.compiler import torch_pickle

    broadcast = tmp_path / "broadcast.bin"
    torch.save({"w": torch.ones(1).as_strided((100000, 100000), (0, 0))}, broadcast)
    with pytest.raises(torch_pickle.TorchPickleError, match="reaches past its storage"):
        list(torch_pickle.read(broadcast))
    plain = tmp_path / "plain.bin"
    torch.save({"w": torch.ones(64)}, plain)
    with zipfile.ZipFile(plain) as archive:
        entries = {n: archive.read(n) for n in archive.namelist()}
    squeezed = _zip_with(tmp_path / "deflated.bin", entries, zipfile.ZIP_DEFLATED)
    with pytest.raises(torch_pickle.TorchPickleError, match="compressed"):
        list(torch_pickle.read(squeezed))
