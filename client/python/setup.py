"""Build hook of the megatrain-client package (pyproject.toml holds the
metadata): generates the gRPC stubs of proto/megatrain/v1 into the built
package (megatrain_client/_generated/megatrain/v1/*_pb2*.py) with protoc
and grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc),
so that the installed package imports them without the repository.

The protos are read from ../../proto (a checkout), or from
$MEGATRAIN_PROTO_DIR.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["megatrain/v1/job.proto", "megatrain/v1/checkpoint.proto", "megatrain/v1/server.proto"]


def generate_stubs(out_dir):
    proto_root = os.environ.get("MEGATRAIN_PROTO_DIR", os.path.join(HERE, "..", "..", "proto"))
    missing = [p for p in PROTOS if not os.path.isfile(os.path.join(proto_root, p))]
    if missing:
        raise SystemExit(f"megatrain-client: {', '.join(missing)} not found under {proto_root}; "
                         "build from a MegaTrain checkout or set MEGATRAIN_PROTO_DIR")
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        raise SystemExit("megatrain-client: protoc and grpc_python_plugin are needed to build "
                         "(apt-get install protobuf-compiler protobuf-compiler-grpc)")
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([protoc, "-I", proto_root, "--python_out", out_dir, "--grpc_python_out",
                    out_dir, "--plugin=protoc-gen-grpc_python=" + plugin] + PROTOS, check=True)


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs(os.path.join(self.build_lib, "megatrain_client", "_generated"))


setup(cmdclass={"build_py": BuildPyWithStubs})
