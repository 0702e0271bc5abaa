"""What reads the pickles in a checkpoint, so that reading one runs no code from it: the ranks'
private state (nested plain data with tensors as raw bytes, ``rank-NNNNN.pkl``), and DCP's
index and non-tensor values, which DCP itself would read with plain ``pickle.load`` and
``torch.load(weights_only=False)``.

Apart from ckptfiles.py (the directory's layout, checksums and verification) because this is
the file formats' trust boundary: what an unpickler accepts, and what a save refuses so that
the load will accept it.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from .ckptfiles import DCP_METADATA, TensorRef
from .ckptshare import _flat_keys
from .exitcodes import ConfigError


# --- private state: nested plain data with tensors as raw bytes ------------------------------
def _encode(obj: Any, out: list[tuple[str, list[int], bytes]]) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.is_quantized or obj.is_nested:
            raise ConfigError("sparse, quantized and nested tensors are not supported")
        host = obj.detach().to("cpu").contiguous()
        raw = host.reshape(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b""
        out.append((str(host.dtype), list(host.shape), raw))
        return TensorRef(len(out) - 1)
    if isinstance(obj, dict):
        encoded = {k: _encode(v, out) for k, v in obj.items()}
        return type(obj)(encoded) if type(obj) is not dict else encoded
    if isinstance(obj, list):
        return [_encode(v, out) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_encode(v, out) for v in obj)
    return obj


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise pickle.UnpicklingError(f"unknown dtype {name}")
    return value


def _decode(obj: Any, tensors: list[tuple[str, list[int], bytes]]) -> Any:
    if isinstance(obj, TensorRef):
        dtype_name, shape, data = tensors[obj.index]
        dtype = _dtype(dtype_name)
        if not data:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    if isinstance(obj, dict):
        decoded = {k: _decode(v, tensors) for k, v in obj.items()}
        return type(obj)(decoded) if type(obj) is not dict else decoded
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_decode(v, tensors) for v in obj)
    return obj


class _SafeUnpickler(pickle.Unpickler):
    """Private state holds plain data: refuse every global except these few."""

    _ALLOWED = frozenset(
        {
            (TensorRef.__module__, "TensorRef"),  # trainstack_runtime.ckptfiles
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "complex"),
            ("builtins", "slice"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint refers to disallowed global {module}.{name}")


def safe_loads(data: bytes) -> Any:
    return _SafeUnpickler(io.BytesIO(data)).load()


def dumps_private(obj: Any) -> bytes:
    """Pickle private state with its tensors as bytes, refusing what ``loads_private`` would."""
    tensors: list[tuple[str, list[int], bytes]] = []
    data = pickle.dumps((_encode(obj, tensors), tensors), protocol=5)
    try:
        safe_loads(data)
    except pickle.UnpicklingError as err:
        raise ConfigError(
            f"training state holds an object checkpoints cannot restore: {err}"
        ) from err
    return data


def loads_private(data: bytes) -> Any:
    skeleton, tensors = safe_loads(data)
    return _decode(skeleton, tensors)


def unrestorable_value(tree: Any) -> str | None:
    """The first value of a DCP state dict that a restore would refuse, as an error message.

    DCP writes every non-tensor value (a module's ``get_extra_state()``, an optimizer's
    learning rate) with ``torch.save`` (default_planner.py ``transform_object``, torch 2.13.0)
    and the runtime reads it back with ``torch.load(weights_only=True)`` (SafeLoadPlanner):
    anything else would let a checkpoint's writer run code at resume. A value that unpickler
    refuses (an ``io.BytesIO``, as older Transformer Engine's extra state is) saved and
    committed, then failed every resume hours later (issue 40 #2): the first save refuses it
    instead, naming the key. Keys are DCP's flattened names (ckptshare._flat_keys).
    """
    for key, value in _flat_keys(tree).items():
        if isinstance(value, torch.Tensor):
            continue
        buffer = io.BytesIO()
        torch.save(value, buffer)
        buffer.seek(0)
        try:
            torch.load(buffer, weights_only=True)
        except Exception as err:
            text = str(err).strip()
            reason = text.splitlines()[0] if text else type(err).__name__
            return (
                f"{key}: a {type(value).__name__} that no checkpoint can restore (the runtime "
                f"reads non-tensor values with torch.load(weights_only=True): {reason}); "
                "return tensors, numbers, strings, lists or dicts of them instead (for a "
                "module's get_extra_state, a tensor of its bytes)"
            )
    return None


# --- DCP readers that unpickle only data -----------------------------------------------------
class _MetadataUnpickler(pickle.Unpickler):
    """DCP's FileSystemReader.read_metadata is a plain ``pickle.load`` (any global, so any
    code); its index holds only DCP's metadata dataclasses, sizes, dtypes and paths.

    Exactly the (module, name) pairs DCP's index uses at torch 2.13.0, never a whole module
    and never a dotted name: pickle protocol 4 resolves ``STACK_GLOBAL(module, "a.b")`` by
    attribute walk, and torch.distributed.checkpoint.metadata imports ``os`` and ``torch``,
    so allowing that module allowed ``os.system`` (issue 40 #1). tests/runtime/
    test_ckptpickle.py checks the list against what dcp.save writes and attacks it."""

    _METADATA = "torch.distributed.checkpoint.metadata"
    _ALLOWED = frozenset(
        {
            (_METADATA, "Metadata"),
            (_METADATA, "MetadataIndex"),
            (_METADATA, "StorageMeta"),
            (_METADATA, "TensorStorageMetadata"),
            (_METADATA, "BytesStorageMetadata"),
            (_METADATA, "ChunkStorageMetadata"),
            (_METADATA, "TensorProperties"),
            (_METADATA, "_MEM_FORMAT_ENCODING"),  # an Enum: rebuilt from its value
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),  # a torch.layout from its name only
            ("pathlib", "PosixPath"),
            ("collections", "OrderedDict"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in self._ALLOWED:
                return super().find_class(module, name)
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint index refers to disallowed global {module}.{name}"
        )


class SafeReader(FileSystemReader):
    def read_metadata(self, *_: Any, **__: Any) -> Metadata:
        path = Path(self.path) / DCP_METADATA
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} is not a checkpoint index")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rates, betas...) are ``torch.save`` blobs that
    DefaultLoadPlanner.load_bytes reads with ``torch.load(weights_only=False)``
    (default_planner.py, torch 2.13.0): check them with the weights-only unpickler first."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        torch.load(value, weights_only=True)  # raises on anything but plain data
        value.seek(0)
        super().load_bytes(read_item, value)
