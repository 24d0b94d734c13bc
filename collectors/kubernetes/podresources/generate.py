"""Regenerate the checked-in Python code from api.proto.

    .venv/bin/python -m lockstep.collectors.kubernetes.podresources.generate

Needs grpcio-tools (the test extra pins the exact version, because the generated code
records it: api_pb2.py refuses an older protobuf runtime than the generator's, and
api_pb2_grpc.py an older grpcio).  After a grpcio-tools upgrade, regenerate and raise the
lower bounds of grpcio and protobuf in pyproject.toml to the versions the new code names.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# The proto's name as protoc sees it: it gives the generated imports their package.  The folder
# collectors/ is the package lockstep.collectors (pyproject.toml package-dir), so protoc is told
# that lockstep/collectors/ is the repository's collectors/ (a virtual path, --proto_path=V=DIR).
PROTO = "lockstep/collectors/kubernetes/podresources/api.proto"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Generate the code into ``out_dir``/lockstep/collectors/kubernetes/podresources/; returns the
    files written."""
    from grpc_tools import protoc  # the generator, a test/dev dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")  # protobuf's well-known types
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path=lockstep/collectors={REPO / 'collectors'}",
            f"--proto_path={include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            PROTO,
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit status {status})")
    return [out_dir / "lockstep" / "collectors" / "kubernetes" / "podresources" / name for name in GENERATED]


def main() -> int:
    with tempfile.TemporaryDirectory() as out_dir:
        for path in generate(Path(out_dir)):
            target = REPO / "collectors" / "kubernetes" / "podresources" / path.name
            shutil.copyfile(path, target)
            print(f"wrote {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
