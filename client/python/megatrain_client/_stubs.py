"""The gRPC stubs of proto/megatrain/v1.

Where they come from, first found:
  1. $MEGATRAIN_CLIENT_STUBS: a directory that holds megatrain/v1/*_pb2*.py;
  2. the installed package's own (megatrain_client/_generated), generated
     from proto/ when the package was built (setup.py, pyproject.toml);
  3. in a checkout (PYTHONPATH=client/python), generated on first import
     with Debian's protoc and grpc_python_plugin (protobuf-compiler,
     protobuf-compiler-grpc) into a cache directory keyed by the protos'
     content, so the stubs never drift from proto/.
A missing grpcio or protobuf is an ImportError saying what to install.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

_PROTO_ROOT = os.path.abspath(
    os.environ.get("MEGATRAIN_PROTO_DIR",
                   os.path.join(os.path.dirname(__file__), "..", "..", "..", "proto")))
_PROTOS = ["megatrain/v1/job.proto", "megatrain/v1/checkpoint.proto",
           "megatrain/v1/server.proto"]


def _generate():
    missing = [p for p in _PROTOS if not os.path.isfile(os.path.join(_PROTO_ROOT, p))]
    if missing:
        raise ImportError("megatrain_client: no generated stubs in this installation and no "
                          f"{missing[0]} under {_PROTO_ROOT}: install the package "
                          "(pip install client/python) or set MEGATRAIN_PROTO_DIR")
    digest = hashlib.sha256()
    for p in _PROTOS:
        with open(os.path.join(_PROTO_ROOT, p), "rb") as f:
            digest.update(f.read())
    cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    out = os.path.join(cache, "megatrain_client", digest.hexdigest()[:16])
    if os.path.exists(os.path.join(out, "megatrain", "v1", "server_pb2_grpc.py")):
        return out
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc is None or plugin is None:
        raise ImportError("megatrain_client: protoc and grpc_python_plugin are needed to generate "
                          "the stubs (apt-get install protobuf-compiler protobuf-compiler-grpc), "
                          "or set MEGATRAIN_CLIENT_STUBS")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(out))
    subprocess.run([protoc, "-I", _PROTO_ROOT, "--python_out", tmp, "--grpc_python_out", tmp,
                    "--plugin=protoc-gen-grpc_python=" + plugin] + _PROTOS, check=True)
    try:
        os.rename(tmp, out)  # atomic: concurrent importers see all files or none
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    return out


_INSTALL_HINT = ("pip install grpcio protobuf, or apt-get install python3-grpcio "
                 "python3-protobuf")


def _require(module, package):
    try:
        __import__(module)
    except ImportError as e:
        raise ImportError(f"megatrain_client needs the {package} package ({_INSTALL_HINT}): "
                          f"{e}") from None


def _stub_dir():
    if os.environ.get("MEGATRAIN_CLIENT_STUBS"):
        return os.environ["MEGATRAIN_CLIENT_STUBS"]
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_generated")
    if os.path.exists(os.path.join(bundled, "megatrain", "v1", "server_pb2_grpc.py")):
        return bundled
    return _generate()


_require("google.protobuf", "protobuf")
_require("grpc", "grpcio")
_dir = _stub_dir()
if _dir not in sys.path:
    sys.path.insert(0, _dir)

from megatrain.v1 import checkpoint_pb2, checkpoint_pb2_grpc  # noqa: E402
from megatrain.v1 import job_pb2, job_pb2_grpc  # noqa: E402
from megatrain.v1 import server_pb2, server_pb2_grpc  # noqa: E402

__all__ = ["checkpoint_pb2", "checkpoint_pb2_grpc", "job_pb2", "job_pb2_grpc", "server_pb2",
           "server_pb2_grpc"]
