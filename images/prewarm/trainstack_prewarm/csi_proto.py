"""The CSI spec's messages and gRPC stubs, generated from its ``csi.proto`` at build time.

The spec is not copied into this repository. ``python -m trainstack_prewarm.csi_proto`` takes
``csi.proto`` from the Go module ``github.com/container-storage-interface/spec`` (a module zip
from ``$GOPROXY``, default https://proxy.golang.org, checked against a pinned sha256 and
cached under ``$XDG_CACHE_HOME/trainstack``) and runs ``grpc_tools.protoc`` (grpcio-tools, a
build/dev dependency only) into ``trainstack_prewarm/_csi/``, which git ignores. The image's
build stage and ``make setup`` run it; the wheel then carries the generated modules.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

SPEC_MODULE = "github.com/container-storage-interface/spec"
SPEC_VERSION = "v1.12.0"
# sha256 of the module zip proxy.golang.org serves for SPEC_VERSION.
SPEC_ZIP_SHA256 = "7db9d6ab828ad6b71f9861e78bd4c1c4eb3906bd804e8fd304c5143ea73a3da9"
GENERATED_PACKAGE = "trainstack_prewarm._csi"
GENERATED_DIR = Path(__file__).resolve().parent / "_csi"


class CsiProtoMissing(RuntimeError):
    """The generated modules are absent: run ``python -m trainstack_prewarm.csi_proto``."""


def load() -> tuple[Any, Any]:
    """``(csi_pb2, csi_pb2_grpc)``, untyped (generated code)."""
    try:
        pb2: ModuleType = importlib.import_module(f"{GENERATED_PACKAGE}.csi_pb2")
        grpc_mod: ModuleType = importlib.import_module(f"{GENERATED_PACKAGE}.csi_pb2_grpc")
    except ModuleNotFoundError as exc:
        raise CsiProtoMissing(
            f"{GENERATED_DIR}: no generated CSI modules; run "
            "`python -m trainstack_prewarm.csi_proto` (needs grpcio-tools)"
        ) from exc
    return pb2, grpc_mod


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainstack" / "csi-spec"


def spec_zip(path: Path | None = None) -> Path:
    """The module zip, downloaded once and checked against SPEC_ZIP_SHA256."""
    if path is None:
        path = _cache_dir() / f"spec-{SPEC_VERSION}.zip"
    if not path.exists():
        proxy = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0].rstrip("/")
        if proxy in {"", "off", "direct"}:
            proxy = "https://proxy.golang.org"
        url = f"{proxy}/{SPEC_MODULE}/@v/{SPEC_VERSION}.zip"
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=60) as resp:
            data = resp.read()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SPEC_ZIP_SHA256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {SPEC_ZIP_SHA256}")
    return path


def generate(dest: Path = GENERATED_DIR, zip_path: Path | None = None) -> Path:
    """Generate ``csi_pb2.py`` and ``csi_pb2_grpc.py`` into ``dest`` (a package)."""
    from grpc_tools import protoc  # noqa: PLC0415 (build/dev dependency only)

    archive = spec_zip(zip_path)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(archive) as zf:
        member = f"{SPEC_MODULE}@{SPEC_VERSION}/csi.proto"
        proto = Path(tmp) / "csi.proto"
        proto.write_bytes(zf.read(member))
        include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
        dest.mkdir(parents=True, exist_ok=True)
        rc = protoc.main(
            [
                "protoc",
                f"-I{tmp}",
                f"-I{include}",
                f"--python_out={dest}",
                f"--grpc_python_out={dest}",
                str(proto),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc exited {rc}")
    stubs = dest / "csi_pb2_grpc.py"
    # protoc writes a top-level import; the modules live in a package.
    stubs.write_text(
        stubs.read_text().replace("import csi_pb2 as csi__pb2", "from . import csi_pb2 as csi__pb2")
    )
    (dest / "__init__.py").write_text(
        f'"""Generated from {SPEC_MODULE}@{SPEC_VERSION} csi.proto; not in git."""\n'
    )
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zip", type=Path, help="the module zip, already downloaded")
    parser.add_argument("--dest", type=Path, default=GENERATED_DIR)
    args = parser.parse_args()
    print(generate(args.dest, args.zip))


if __name__ == "__main__":
    main()
