"""Generates the Python protobuf and gRPC modules beside the .proto files in protos/."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
# Virtual include path: the generated modules import each other as trnsim.protos.<name>_pb2.
PACKAGE_PATH = "trnsim/protos"
SERVICE_PROTOS = {"compile_service.proto"}


def generated_names(proto: Path) -> list[str]:
    stem = proto.stem
    names = [f"{stem}_pb2.py", f"{stem}_pb2.pyi"]
    if proto.name in SERVICE_PROTOS:
        names.append(f"{stem}_pb2_grpc.py")
    return names


def generate(out_dir: Path = PROTO_DIR) -> list[Path]:
    """Runs protoc for every protos/*.proto and writes the modules into out_dir."""
    from grpc_tools import protoc  # build-time dependency only

    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).resolve().parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PACKAGE_PATH}={PROTO_DIR}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[f"{PACKAGE_PATH}/{p.name}" for p in protos],
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {[p.name for p in protos]}")
        for proto in protos:
            for name in generated_names(proto):
                source = Path(tmp) / PACKAGE_PATH / name
                if not source.exists():
                    continue  # protoc writes a _grpc module only for files with services
                target = out_dir / name
                shutil.copyfile(source, target)
                written.append(target)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR
    for path in generate(out):
        print(path)
