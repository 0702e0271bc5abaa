"""Issue 40 #1: a checkpoint index (`.metadata`) runs no code, however it is written.

Whoever can write a checkpoint directory can write its `.metadata` and its manifest, so the
checksum is no defence: only the unpickler is. These files are written byte by byte, as an
attacker would, rather than through pickle.dumps (which cannot emit some of them).
"""

from __future__ import annotations

import pickle
import pickletools
from pathlib import Path

import pytest

from tests.runtime.harness import HAVE_TORCH

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")

if HAVE_TORCH:
    import torch
    import torch.distributed.checkpoint as dcp
    from trainstack_runtime.ckptpickle import SafeReader, _MetadataUnpickler

MARK = "trainstack-test-owned"


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def _stack_global_call(module: str, name: str, arg: str) -> bytes:
    """PROTO 4; STACK_GLOBAL(module, name); call it with (arg,): what `find_class` sees."""
    return (
        pickle.PROTO + b"\x04"
        + _unicode(module) + _unicode(name) + pickle.STACK_GLOBAL
        + _unicode(arg) + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP
    )  # fmt: skip


def _global_call(module: str, name: str, arg: str) -> bytes:
    """Protocol 0's GLOBAL opcode: `module\\nname\\n`."""
    return (
        pickle.GLOBAL + f"{module}\n{name}\n".encode()
        + _unicode(arg) + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP
    )  # fmt: skip


def _index(tmp_path: Path) -> Path:
    """A real DCP checkpoint of tensors of several dtypes and layouts, and plain values."""
    state = {
        "w": torch.randn(3, 4),
        "half": torch.zeros(2, dtype=torch.bfloat16),
        "steps": torch.arange(3),
        "image": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "lr": 0.1,
        "name": "run-7",
        "nested": {"betas": [0.9, 0.999], "t": torch.ones(1)},
    }
    dcp.save(state, checkpoint_id=tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _globals(data: bytes) -> set[tuple[str, str]]:
    """Every (module, name) a pickle asks for, memoised strings included."""
    memo: dict[int, object] = {}
    stack: list[object] = []
    found: set[tuple[str, str]] = set()
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            stack.append(arg)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo.get(int(arg)))
        elif op.name == "STACK_GLOBAL":
            found.add((str(stack[-2]), str(stack[-1])))
        elif op.name == "GLOBAL":
            module, name = str(arg).split(" ", 1)
            found.add((module, name))
    return found


def test_what_dcp_writes_is_read_and_every_global_it_uses_is_allowed(tmp_path: Path) -> None:
    """The allow list is exact: what dcp.save writes at the pinned torch loads, and the pairs
    it uses are the list's own (a torch upgrade that adds one fails here, not at resume)."""
    ckpt = _index(tmp_path)
    metadata = SafeReader(ckpt).read_metadata()
    assert set(metadata.state_dict_metadata) >= {"w", "half", "lr", "nested.betas", "nested.t"}
    used = _globals((ckpt / ".metadata").read_bytes())
    assert ("torch.distributed.checkpoint.metadata", "Metadata") in used
    dtypes = {
        (m, n) for m, n in used if m == "torch" and isinstance(getattr(torch, n), torch.dtype)
    }
    assert used - dtypes <= _MetadataUnpickler._ALLOWED


@pytest.mark.parametrize(
    ("module", "name"),
    [
        # The 70-byte file: a dotted name inside an allowed module walks to os.system.
        ("torch.distributed.checkpoint.metadata", "os.system"),
        ("torch.distributed.checkpoint.metadata", "torch.load"),
        ("torch.distributed.checkpoint.metadata", "Metadata.__init__.__globals__"),
        ("torch", "Size.__new__"),
        ("torch", "float32.__class__"),
        ("pathlib", "PosixPath.write_text"),
        # Plain gadgets.
        ("os", "system"),
        ("builtins", "eval"),
        ("builtins", "exec"),
        ("subprocess", "getoutput"),
        ("torch", "load"),
        ("torch.serialization", "load"),
        # Other names of the modules that are allowed in part.
        ("torch.distributed.checkpoint.metadata", "dataclass"),
        ("torch.distributed.checkpoint.filesystem", "FileSystemReader"),
    ],
)
@pytest.mark.parametrize("opcode", ["STACK_GLOBAL", "GLOBAL"])
def test_a_hostile_index_is_refused_before_it_runs_anything(
    tmp_path: Path, module: str, name: str, opcode: str
) -> None:
    ckpt = _index(tmp_path)
    marker = tmp_path / MARK
    build = _stack_global_call if opcode == "STACK_GLOBAL" else _global_call
    (ckpt / ".metadata").write_bytes(build(module, name, f"touch {marker}"))
    with pytest.raises(pickle.UnpicklingError, match="disallowed global"):
        SafeReader(ckpt).read_metadata()
    assert not marker.exists()


def test_a_gadget_nested_inside_a_valid_index_is_refused(tmp_path: Path) -> None:
    """A gadget spliced into a real index, whose result is discarded so that the rest loads
    as before: refused as the unpickler reaches it, not after (isinstance checks come
    too late)."""
    ckpt = _index(tmp_path)
    data = (ckpt / ".metadata").read_bytes()
    marker = tmp_path / MARK
    evil = _stack_global_call("torch.distributed.checkpoint.metadata", "os.system",
                              f"touch {marker}")[2:-1]  # fmt: skip
    # After the PROTO header: the call, its result popped, then the real index unchanged,
    # so that the file still loads as an index if the call is let through.
    (ckpt / ".metadata").write_bytes(data[:2] + evil + pickle.POP + data[2:])
    with pytest.raises(pickle.UnpicklingError, match="disallowed global"):
        SafeReader(ckpt).read_metadata()
    assert not marker.exists()
