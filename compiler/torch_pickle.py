"""A PyTorch checkpoint (``pytorch_model.bin``, ``torch.save`` of a state dict) read without
torch and without running its pickle's code.

Older Hub repos (OPT's, many fine-tunes) ship their weights only this way. ``torch.load`` would
need torch (hundreds of MB, not a dependency of wick's compiler) and, without
``weights_only=True``, runs whatever the pickle names. This reader does what that mode does for
state dicts: the pickle may name only the few functions a saved tensor is rebuilt with
(``ALLOWED``); anything else (``os.system``, ``builtins.eval``, ...) is refused before it is
looked up, so nothing in the file runs.

The file is torch's zip format (torch >= 1.6): ``<archive>/data.pkl`` holds the structure, each
storage is ``<archive>/data/<key>``, raw little-endian bytes (``<archive>/byteorder`` says
otherwise). A tensor is a view (offset, shape, strides in elements) of one storage; tensors may
share one (a tied embedding). ``read`` materializes one tensor at a time, each a contiguous
numpy copy, so a checkpoint costs about its own size in memory plus its largest storage.
"""

from __future__ import annotations

import math
import pickle
from collections import OrderedDict
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

# torch's storage classes -> (numpy dtype, the stored dtype's safetensors name)
STORAGE_DTYPES = {
    "FloatStorage": ("f4", "F32"), "HalfStorage": ("f2", "F16"), "BFloat16Storage": ("u2", "BF16"),
    "DoubleStorage": ("f8", "F64"), "LongStorage": ("i8", "I64"), "IntStorage": ("i4", "I32"),
    "ShortStorage": ("i2", "I16"), "CharStorage": ("i1", "I8"), "ByteStorage": ("u1", "U8"),
    "BoolStorage": ("?", "BOOL"),
}  # fmt: skip


class TorchPickleError(ValueError):
    """The file is not a state dict this reader takes (or names code it will not run)."""


@dataclass(frozen=True)
class StorageRef:
    key: str
    storage_class: str


@dataclass(frozen=True)
class TensorRef:
    """A saved tensor before its bytes are read: a strided view of one storage."""

    storage: StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(storage, offset, shape, stride, requires_grad=False, hooks=None,
                       metadata=None) -> TensorRef:
    return _tensor(storage, offset, shape, stride)


def _rebuild_tensor(storage, offset, shape, stride) -> TensorRef:  # (torch < 1.x's v1)
    return _tensor(storage, offset, shape, stride)


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None) -> TensorRef:
    if not isinstance(data, TensorRef):
        raise TorchPickleError("a parameter that does not hold a saved tensor")
    return data


def _tensor(storage, offset, shape, stride) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise TorchPickleError("a tensor that does not view a saved storage")
    try:
        ref = TensorRef(storage, int(offset), tuple(int(n) for n in shape),
                        tuple(int(n) for n in stride))
    except (TypeError, ValueError):
        raise TorchPickleError("a tensor with a malformed shape or stride") from None
    if len(ref.shape) != len(ref.stride) or min((ref.offset, *ref.shape, *ref.stride),
                                                default=0) < 0:
        raise TorchPickleError("a tensor with a malformed shape or stride")
    return ref


class _StorageClass:
    """What ``torch.FloatStorage`` and its kin unpickle as: only their name is needed."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _fresh(function: Callable[..., Any]) -> Callable[..., Any]:
    """A new callable for each lookup: what a pickle does to it (its BUILD opcode can set
    attributes) stays with that one object, never with this module's functions."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
    return call


# (module, name) -> a maker of what the pickle gets for it; nothing else can be named
ALLOWED: dict[tuple[str, str], Callable[[], Any]] = {
    ("collections", "OrderedDict"): lambda: type("StateDict", (OrderedDict,), {}),
    ("torch._utils", "_rebuild_tensor_v2"): lambda: _fresh(_rebuild_tensor_v2),
    ("torch._utils", "_rebuild_tensor"): lambda: _fresh(_rebuild_tensor),
    ("torch._utils", "_rebuild_parameter"): lambda: _fresh(_rebuild_parameter),
    ("torch._utils", "_rebuild_parameter_with_state"): lambda: _fresh(_rebuild_parameter),
    **{("torch", name): (lambda name=name: _StorageClass(name)) for name in STORAGE_DTYPES},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        make = ALLOWED.get((module, name))
        if make is not None:
            return make()
        if module == "torch" and name.endswith("Storage"):
            raise TorchPickleError(f"its tensors are stored as {name}, a type wick does not "
                                   f"read (it reads {', '.join(STORAGE_DTYPES)})")
        raise TorchPickleError(
            f"its pickle names {module}.{name}, which a checkpoint of tensors does not "
            "need: refused, nothing in it was run")

    def persistent_load(self, pid: Any) -> StorageRef:
        # ('storage', storage class, key, location, number of elements)
        if (not isinstance(pid, tuple) or len(pid) < 3 or pid[0] != "storage"
                or not isinstance(pid[1], _StorageClass)
                or pid[1].name not in STORAGE_DTYPES):
            raise TorchPickleError(f"an unknown persistent reference {pid!r:.80}")
        return StorageRef(str(pid[2]), pid[1].name)


def _archive_root(names: list[str]) -> str:
    roots = [n[: -len("data.pkl")] for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(roots) != 1:
        raise TorchPickleError("no data.pkl at the top of its zip: not a torch.save file")
    return roots[0]


def read(file: Path) -> Iterator[tuple[str, np.ndarray, str]]:
    """(name, array, stored dtype's safetensors name) for each tensor of the state dict in
    ``file``; bfloat16 becomes float32 exactly (numpy has no bf16), as hf_source does."""
    with _open(file) as archive:
        root, state = _state(archive)
        byteorder = "<"
        if root + "byteorder" in archive.namelist():
            byteorder = ">" if archive.read(root + "byteorder").strip() == b"big" else "<"
        cached: tuple[str, np.ndarray] | None = None  # (tied tensors share the last storage)
        for name, ref in state.items():
            numpy_dtype, stored = STORAGE_DTYPES[ref.storage.storage_class]
            if cached is None or cached[0] != ref.storage.key:
                data = _storage_bytes(archive, f"{root}data/{ref.storage.key}", file, name)
                cached = (ref.storage.key, np.frombuffer(
                    data, dtype=byteorder + numpy_dtype, count=len(data) // np.dtype(
                        numpy_dtype).itemsize))
            yield name, _widened(_view(cached[1], ref, name), stored), stored


def _storage_bytes(archive: zipfile.ZipFile, entry: str, file: Path, name: str) -> bytes:
    """A storage's bytes, which torch writes uncompressed: a compressed entry (whose size
    could be anything once inflated) is refused."""
    try:
        info = archive.getinfo(entry)
    except KeyError:
        raise TorchPickleError(f"tensor {name}'s storage is not in the file") from None
    if info.compress_type != zipfile.ZIP_STORED or info.file_size > file.stat().st_size:
        raise TorchPickleError(f"tensor {name}'s storage is compressed, which torch.save "
                               "never does")
    return archive.read(info)


def count(file: Path) -> int:
    """How many tensors ``file`` holds (its pickle alone is read)."""
    with _open(file) as archive:
        return len(_state(archive)[1])


def _open(file: Path) -> zipfile.ZipFile:
    if not zipfile.is_zipfile(file):
        raise TorchPickleError(
            "it is not in torch's zip format: a checkpoint saved by torch before 1.6 (or not "
            "by torch). Convert it to safetensors (transformers' save_pretrained does) and "
            "point wick at that")
    return zipfile.ZipFile(file)


def _state(archive: zipfile.ZipFile) -> tuple[str, dict[str, TensorRef]]:
    """(the archive's root folder, tensor name -> its reference) from its data.pkl."""
    root = _archive_root(archive.namelist())
    try:
        state = _Unpickler(archive.open(root + "data.pkl")).load()
    except TorchPickleError:
        raise
    except Exception as err:  # noqa: BLE001 - a damaged pickle: any of pickle's errors
        raise TorchPickleError(f"its data.pkl does not unpickle ({err})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # (a training checkpoint's wrapper)
    if not isinstance(state, dict):
        raise TorchPickleError("it holds a pickled object, not a state dict of tensors")
    # (other entries, such as a step counter, are not weights)
    return root, {str(k): v for k, v in state.items() if isinstance(v, TensorRef)}


def _view(storage: np.ndarray, ref: TensorRef, name: str) -> np.ndarray:
    """The tensor's elements as a contiguous native-order copy (bf16 widened to f32)."""
    extent = ref.offset + sum((n - 1) * s for n, s in zip(ref.shape, ref.stride)) + 1
    elements = math.prod(ref.shape)
    # (a state dict's tensors never repeat elements: more of them than the storage holds is a
    # damaged or hostile file, which would otherwise allocate without bound)
    if elements and (extent > storage.size or elements > storage.size):
        raise TorchPickleError(f"tensor {name} reaches past its storage")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[ref.offset:], shape=ref.shape, strides=tuple(s * item for s in ref.stride),
        writeable=False)
    return np.array(view, dtype=storage.dtype.newbyteorder("="), order="C", copy=True)


def _widened(array: np.ndarray, stored: str) -> np.ndarray:
    """bfloat16's bits (read as uint16) as the float32 they are the top half of."""
    if stored != "BF16":
        return array
    return (array.astype(np.uint32) << 16).view(np.float32)
