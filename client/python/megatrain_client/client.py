"""Client: the megatraind RPCs as Python calls (docs/api.md, "Python client").

Messages come back as plain dicts (protobuf's MessageToDict with the proto
field names; enums as their names, e.g. "JOB_STATE_SUCCEEDED"; int64 fields
as strings, as in protobuf's JSON mapping). Every RPC error is raised as
MegatrainError carrying the gRPC status code and the daemon's message.

Thread-safety: a Client may be shared between threads (gRPC channels and
stubs are thread-safe); close() it once, from one thread.
"""
import os
import sys

import grpc
from google.protobuf import json_format

from megatrain_client import _stubs

job_pb2 = _stubs.job_pb2
checkpoint_pb2 = _stubs.checkpoint_pb2
server_pb2 = _stubs.server_pb2

# Job spec keys whose values are paths: made absolute against the job file's
# directory (or the working directory for a dict), as the CLI does
# (client/job_file.cc); the daemon requires absolute paths.
_PATH_KEYS = {("model", "hf_dir"), ("data", "tokens"), ("data", "eval_tokens"),
              ("data", "text"), ("data", "tokenizer"), ("output_dir",)}
# YAML spellings of the enums (the CLI's) -> proto names.
_ENUMS = {("train", "compute_dtype"): "COMPUTE_DTYPE_", ("train", "nan_policy"): "NAN_POLICY_"}
_TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}


class MegatrainError(Exception):
    """An RPC failed. `code` is the grpc.StatusCode (e.g.
    grpc.StatusCode.INVALID_ARGUMENT), `code_name` its name, `message` the
    daemon's message (which names the field or the job)."""

    def __init__(self, code, message):
        self.code = code
        self.code_name = code.name if code is not None else "UNKNOWN"
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


def _convert(spec, base_dir, prefix=()):
    """Copies `spec` with paths made absolute and enum spellings mapped."""
    out = {}
    for key, value in spec.items():
        path = prefix + (key,)
        if isinstance(value, dict) and key != "labels":
            out[key] = _convert(value, base_dir, path)
        elif path in _PATH_KEYS and isinstance(value, str) and value:
            out[key] = os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))
        elif path in _ENUMS and isinstance(value, str) and not value.isupper():
            out[key] = _ENUMS[path] + value.upper()
        else:
            out[key] = value
    return out


def job_spec(spec):
    """A megatrain.v1.JobSpec from a dict (the job file's keys), a path to a
    YAML job file, or a JobSpec (returned as is). Raises ValueError naming
    the field for an unknown key or a value of the wrong type."""
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    base_dir = os.getcwd()
    if isinstance(spec, (str, os.PathLike)):
        import yaml  # Debian: python3-yaml
        path = os.fspath(spec)
        with open(path, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
        base_dir = os.path.dirname(os.path.abspath(path))
        if not isinstance(spec, dict):
            raise ValueError(f"{path}: not a YAML mapping")
    if not isinstance(spec, dict):
        raise TypeError(f"job_spec: expected a dict, a path or a JobSpec, got {type(spec).__name__}")
    message = job_pb2.JobSpec()
    try:
        json_format.ParseDict(_convert(spec, base_dir), message)
    except json_format.ParseError as e:
        raise ValueError(f"job spec: {e}") from None
    return message


def _to_dict(message):
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class Client:
    """One channel to megatraind. Options are the CLI's (`megatrain --help`):
    server "host:port" (default $MEGATRAIN_SERVER or 127.0.0.1:50051), token
    (default $MEGATRAIN_TOKEN), tls / tls_ca / tls_cert / tls_key /
    tls_server_name (any tls_* file turns TLS on), timeout_s per unary call.
    """

    def __init__(self, server=None, token=None, tls=False, tls_ca=None, tls_cert=None,
                 tls_key=None, tls_server_name=None, timeout_s=60.0):
        server = server or os.environ.get("MEGATRAIN_SERVER", "127.0.0.1:50051")
        self._token = token if token is not None else os.environ.get("MEGATRAIN_TOKEN", "")
        self._timeout_s = timeout_s
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("tls_cert and tls_key: give both or neither")
        if tls or tls_ca or tls_cert or tls_key or tls_server_name:
            def read(path):
                if not path:
                    return None
                with open(path, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key), read(tls_cert))
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self._channel = grpc.secure_channel(server, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(server)
        self._jobs = _stubs.job_pb2_grpc.JobServiceStub(self._channel)
        self._checkpoints = _stubs.checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)
        self._server = _stubs.server_pb2_grpc.ServerServiceStub(self._channel)

    # -- plumbing ---------------------------------------------------------
    def _metadata(self):
        return [("authorization", "Bearer " + self._token)] if self._token else []

    def _call(self, method, request, timeout_s=None):
        try:
            return method(request, timeout=timeout_s or self._timeout_s, metadata=self._metadata())
        except grpc.RpcError as e:
            raise MegatrainError(e.code(), e.details()) from None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- jobs -------------------------------------------------------------
    def submit(self, spec, request_id=""):
        """Queues a job from a dict, a YAML job file path or a JobSpec;
        returns the Job. A repeated request_id returns the same job."""
        request = job_pb2.SubmitJobRequest(spec=job_spec(spec), request_id=request_id)
        return _to_dict(self._call(self._jobs.SubmitJob, request))

    def get(self, job_id):
        return _to_dict(self._call(self._jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id)))

    def list(self, states=(), owner="", page_size=100):
        """All jobs (every page), newest first; states: names such as
        "RUNNING" or "JOB_STATE_RUNNING"."""
        state_values = [job_pb2.JobState.Value(s if s.startswith("JOB_STATE_") else "JOB_STATE_" + s)
                        for s in states]
        jobs, token = [], ""
        while True:
            request = job_pb2.ListJobsRequest(page_size=page_size, page_token=token,
                                              states=state_values, owner=owner)
            response = self._call(self._jobs.ListJobs, request)
            jobs.extend(_to_dict(j) for j in response.jobs)
            token = response.next_page_token
            if not token:
                return jobs

    def cancel(self, job_id, force=False):
        """Cancels a job. A running one stops at its next step boundary; with
        force=True it abandons the running step (losing only that step) and
        stops within seconds."""
        return _to_dict(self._call(self._jobs.CancelJob,
                                   job_pb2.CancelJobRequest(job_id=job_id, force=force)))

    def suspend(self, job_id):
        return _to_dict(self._call(self._jobs.SuspendJob, job_pb2.SuspendJobRequest(job_id=job_id)))

    def resume(self, job_id):
        return _to_dict(self._call(self._jobs.ResumeJob, job_pb2.ResumeJobRequest(job_id=job_id)))

    def watch(self, job_id, after_seq=0):
        """Yields the job's events (dicts with one of state_change, step,
        eval, checkpoint): the history after `after_seq`, then live events;
        ends after the event of a terminal state."""
        request = job_pb2.WatchJobRequest(job_id=job_id, after_seq=after_seq)
        try:
            for event in self._jobs.WatchJob(request, metadata=self._metadata()):
                yield _to_dict(event)
        except grpc.RpcError as e:
            raise MegatrainError(e.code(), e.details()) from None

    def wait(self, job_id, progress=True, file=None):
        """Follows the job to a terminal state and returns the final Job.
        progress: a bar of steps (tqdm when installed, else a text line on
        `file`, default stderr)."""
        file = file or sys.stderr
        bar = _ProgressBar(file) if progress else None
        try:
            for event in self.watch(job_id):
                if bar is not None and "step" in event:
                    s = event["step"]
                    bar.update(int(s.get("step", 0)), int(s.get("max_steps", 0)),
                               s.get("loss", 0.0), s.get("tokens_per_s", 0.0))
        finally:
            if bar is not None:
                bar.close()
        return self.get(job_id)

    # -- checkpoints ------------------------------------------------------
    def checkpoints(self, job_id):
        response = self._call(self._checkpoints.ListCheckpoints,
                              checkpoint_pb2.ListCheckpointsRequest(job_id=job_id))
        return [_to_dict(c) for c in response.checkpoints]

    def export(self, checkpoint_id, out_dir, dtype=""):
        """Writes the checkpoint as a HF directory at out_dir (absolute on
        the daemon's machine); returns the directory."""
        request = checkpoint_pb2.ExportCheckpointRequest(
            checkpoint_id=checkpoint_id, out_dir=os.path.abspath(out_dir), dtype=dtype)
        # Export writes the whole model: no unary deadline.
        return self._call(self._checkpoints.ExportCheckpoint, request, timeout_s=24 * 3600).out_dir

    # -- server -----------------------------------------------------------
    def status(self):
        return _to_dict(self._call(self._server.GetServerStatus, server_pb2.GetServerStatusRequest()))


class _ProgressBar:
    def __init__(self, file):
        self._file = file
        self._tqdm = None
        try:
            from tqdm import tqdm  # optional
            self._tqdm = tqdm(total=0, unit="step", file=file)
        except ImportError:
            pass
        self._last = 0

    def update(self, step, max_steps, loss, tokens_per_s):
        if self._tqdm is not None:
            self._tqdm.total = max_steps
            self._tqdm.update(step - self._last)
            self._tqdm.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:.0f}")
        else:
            width = 30
            done = width * step // max_steps if max_steps else 0
            self._file.write(f"\r[{'#' * done}{'.' * (width - done)}] step {step}/{max_steps} "
                             f"loss {loss:.4f} {tokens_per_s:.0f} tokens/s")
            self._file.flush()
        self._last = step

    def close(self):
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._last:
            self._file.write("\n")
