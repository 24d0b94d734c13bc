"""Regenerate the checked-in Python code from api.proto.

    .venv/bin/python -m lockstep.collectors.podresources.generate

Needs grpcio-tools (the test extra pins the exact version, because the generated code
records it: api_pb2.py refuses an older protobuf runtime than the generator's, and
api_pb2_grpc.py an older grpcio).  After a grpcio-tools upgrade, regenerate and raise the
lower bounds of grpcio and protobuf in pyproject.toml to the versions the new code names.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO = "lockstep/collectors/podresources/api.proto"  # relative to REPO: it gives the generated imports their package
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Generate the code into ``out_dir``/lockstep/collectors/podresources/; returns the files written."""
    from grpc_tools import protoc  # the generator, a test/dev dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")  # protobuf's well-known types
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={REPO}",
            f"--proto_path={include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(REPO / PROTO),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit status {status})")
    return [out_dir / "lockstep" / "collectors" / "podresources" / name for name in GENERATED]


def main() -> int:
    for path in generate(REPO):
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
