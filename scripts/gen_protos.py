#!/usr/bin/env python3
"""Generate the Python stubs of api/protocol/*.proto (protobuf, grpc and mypy .pyi).

Usage: scripts/gen_protos.py [OUT_DIR]   (default: api/protocol, i.e. in place)

The proto is compiled from a temporary tree laid out as its import package
(gpufed/api/protocol/agent.proto) so that the generated grpc module imports
``gpufed.api.protocol.agent_pb2`` rather than a top-level ``agent_pb2``.
tests/unit/test_protocol_drift.py runs this into a temporary directory and compares.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "api" / "protocol"
PACKAGE_PATH = Path("gpufed") / "api" / "protocol"


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto in api/protocol into ``out_dir``; return the files written."""
    protos = sorted(SRC.glob("*.proto"))
    # protoc finds the mypy plugins (protoc-gen-mypy*) on PATH: use this interpreter's bin dir.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "src"
        gen = Path(tmp) / "gen"
        (tree / PACKAGE_PATH).mkdir(parents=True)
        gen.mkdir()
        for proto in protos:
            shutil.copy(proto, tree / PACKAGE_PATH / proto.name)
        include = str(Path(protoc.__file__).parent / "_proto")
        for proto in protos:
            rc = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{tree}",
                    f"-I{include}",
                    f"--python_out={gen}",
                    f"--grpc_python_out={gen}",
                    f"--mypy_out={gen}",
                    f"--mypy_grpc_out={gen}",
                    str(PACKAGE_PATH / proto.name),
                ]
            )
            if rc != 0:
                raise SystemExit(f"protoc failed on {proto} (exit {rc})")
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in sorted((gen / PACKAGE_PATH).iterdir()):
            shutil.copy(f, out_dir / f.name)
            written.append(out_dir / f.name)
    return written


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    for path in generate(out):
        print(path)


if __name__ == "__main__":
    main()
