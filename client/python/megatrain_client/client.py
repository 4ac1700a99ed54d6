"""Client: the megatraind RPCs as Python calls (docs/api.md, "Python client").

Messages come back as plain dicts with the proto field names (which are the
job file's names): enums as their names (e.g. "JOB_STATE_SUCCEEDED"),
64-bit integers as Python ints, fields at their default (0, "", false)
present, optional fields that are unset (eval_loss before the first
evaluation) absent. Every RPC
error is raised as MegatrainError carrying the gRPC status code and the
daemon's message; a bad job spec given as a dict or YAML file is a
JobSpecError (a ValueError) listing every bad field by its YAML path.

Thread-safety: a Client may be shared between threads (gRPC channels and
stubs are thread-safe); close() it once, from one thread.
"""
import os
import sys

from megatrain_client import _stubs  # first: says what to install when grpcio is missing

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from google.protobuf.descriptor import FieldDescriptor  # noqa: E402

job_pb2 = _stubs.job_pb2
checkpoint_pb2 = _stubs.checkpoint_pb2
server_pb2 = _stubs.server_pb2

# Job spec keys whose values are paths: made absolute against the job file's
# directory (or the working directory for a dict), as the CLI does
# (client/job_file.cc); the daemon requires absolute paths.
_PATH_KEYS = {"model.hf_dir", "data.tokens", "data.eval_tokens", "data.text", "data.tokenizer",
              "output_dir"}
# Words the job file accepts in place of a number (client/job_file.cc):
# train.devices "all" is 0 in the proto; train.resident_layers "auto" unset.
_WORD_VALUES = {("train.devices", "all"): 0, ("train.resident_layers", "auto"): None}
# Messages the job file also accepts as one string, and the field it sets:
# `init_from: job-000012/step-400` is {checkpoint: job-000012/step-400}.
_SHORTHAND = {"model.init_from": "checkpoint"}
# String fields that take one of a few words (the daemon checks them too).
_STRING_CHOICES = {"model.init_from.optimizer": ("fresh", "restore")}
# Messages whose field must be set when the mapping is given.
_REQUIRED = {"model.init_from": "checkpoint"}
_TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
_INT_TYPES = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
              FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32,
              FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_FIXED32,
              FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
              FieldDescriptor.TYPE_SFIXED64}
# Integers that protobuf's JSON mapping writes as strings.
_INT64_TYPES = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64,
                FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_FIXED64,
                FieldDescriptor.TYPE_SFIXED64}
_FLOAT_TYPES = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


class MegatrainError(Exception):
    """An RPC failed. `code` is the grpc.StatusCode (e.g.
    grpc.StatusCode.INVALID_ARGUMENT), `code_name` its name, `message` the
    daemon's message (which names the field or the job)."""

    def __init__(self, code, message):
        self.code = code
        self.code_name = code.name if code is not None else "UNKNOWN"
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


class JobSpecError(ValueError):
    """A job spec (dict or YAML file) with bad fields. `errors` lists every
    one, each starting with the field's YAML path ("train.micro_batch:
    expected an integer, got 'x'")."""

    def __init__(self, source, errors):
        self.errors = list(errors)
        super().__init__(f"{source}: " + "; ".join(self.errors))


def _enum_spellings(enum_type):
    """{"fp32": COMPUTE_DTYPE_FP32, ...}: the job file's lower-case words
    (the value name without the enum's prefix) and the proto names."""
    names = [v.name for v in enum_type.values]
    prefix = os.path.commonprefix(names)
    prefix = prefix[:prefix.rfind("_") + 1]
    spellings = {}
    for v in enum_type.values:
        if v.number == 0:
            continue  # *_UNSPECIFIED: the default, not a choice
        spellings[v.name[len(prefix):].lower()] = v.number
        spellings[v.name] = v.number
    return spellings


def _scalar(field, value, where):
    """`value` converted for scalar `field`, or raises ValueError naming
    `where` (the YAML path)."""
    if field.type == FieldDescriptor.TYPE_ENUM:
        spellings = _enum_spellings(field.enum_type)
        if isinstance(value, str) and value in spellings:
            return spellings[value]
        words = [w for w in spellings if w.islower()]
        raise ValueError(f"{where}: must be {', '.join(words[:-1])} or {words[-1]}, got {value!r}")
    if field.type == FieldDescriptor.TYPE_BOOL:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    if field.type in _INT_TYPES:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if field.type in _FLOAT_TYPES:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if field.type == FieldDescriptor.TYPE_STRING:
        if isinstance(value, str):
            return value
        raise ValueError(f"{where}: expected a string, got {value!r}")
    raise ValueError(f"{where}: not settable from a job file")


def _fill(message, spec, path, base_dir, errors):
    """Sets `message` from mapping `spec` (YAML path `path`), appending one
    message per bad field to `errors`."""
    if not isinstance(spec, dict):
        errors.append(f"{path or 'job spec'}: expected a mapping of keys, got {spec!r}")
        return
    message.SetInParent()
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in spec.items():
        where = f"{path}.{key}" if path else str(key)
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            known = ", ".join(f.name for f in message.DESCRIPTOR.fields)
            errors.append(f"{where}: unknown key (known: {known})")
        elif value is None:
            errors.append(f"{where}: missing value")
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            _fill_map(getattr(message, key), value, where, errors)
        elif field.message_type is not None and isinstance(value, str) and where in _SHORTHAND:
            setattr(getattr(message, key), _SHORTHAND[where], value)
        elif field.message_type is not None:
            _fill(getattr(message, key), value, where, base_dir, errors)
            required = _REQUIRED.get(where)
            if required and isinstance(value, dict) and required not in value:
                errors.append(f"{where}.{required}: required")
        elif where in _STRING_CHOICES and value not in _STRING_CHOICES[where]:
            errors.append(f"{where}: must be {' or '.join(_STRING_CHOICES[where])}, got {value!r}")
        elif isinstance(value, str) and (where, value) in _WORD_VALUES:
            if _WORD_VALUES[(where, value)] is not None:
                setattr(message, key, _WORD_VALUES[(where, value)])
        else:
            try:
                converted = _scalar(field, value, where)
                if where in _PATH_KEYS and converted:
                    converted = os.path.normpath(
                        os.path.join(base_dir, os.path.expanduser(converted)))
                setattr(message, key, converted)
            except ValueError as e:
                errors.append(str(e) if str(e).startswith(where) else
                              f"{where}: out of range, got {value!r}")


def _fill_map(target, value, where, errors):
    if not isinstance(value, dict):
        errors.append(f"{where}: expected a mapping of label: value")
        return
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)):
            errors.append(f"{where}.{k}: expected a string")
        else:
            target[k] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def job_spec(spec):
    """A megatrain.v1.JobSpec from a dict (the job file's keys), a path to a
    YAML job file, or a JobSpec (returned as is). Relative paths resolve
    against the file's directory (a dict: the working directory). Raises
    JobSpecError (a ValueError) listing every unknown key and bad value by
    its YAML path."""
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    base_dir = os.getcwd()
    source = "job spec"
    if isinstance(spec, (str, os.PathLike)):
        import yaml  # pip: PyYAML; Debian: python3-yaml
        source = os.fspath(spec)
        with open(source, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
        base_dir = os.path.dirname(os.path.abspath(source))
        if not isinstance(spec, dict):
            raise JobSpecError(source, ["not a YAML mapping"])
    if not isinstance(spec, dict):
        raise TypeError(f"job_spec: expected a dict, a path or a JobSpec, got {type(spec).__name__}")
    message = job_pb2.JobSpec()
    errors = []
    _fill(message, spec, "", base_dir, errors)
    model = spec.get("model")
    if isinstance(model, dict) and model.get("preset") and model.get("hf_dir"):
        errors.append("model: give one of preset and hf_dir, not both")
    if errors:
        raise JobSpecError(source, errors)
    return message


def _with_init_from(spec, init_from, optimizer):
    """A copy of JobSpec `spec` with model.init_from set from submit()'s
    init_from (a checkpoint id or a checkpoints() dict) and optimizer;
    ValueError naming the argument when they are bad."""
    if init_from is None:
        raise ValueError("optimizer: given without init_from (the checkpoint to start from)")
    checkpoint = init_from.get("id") if isinstance(init_from, dict) else init_from
    if not isinstance(checkpoint, str) or not checkpoint:
        raise ValueError("init_from: expected a checkpoint id such as 'job-000012/step-400' or a "
                         f"dict from checkpoints(), got {init_from!r}")
    choices = _STRING_CHOICES["model.init_from.optimizer"]
    if optimizer is not None and optimizer not in choices:
        raise ValueError(f"optimizer: must be {' or '.join(choices)}, got {optimizer!r}")
    if spec.model.init_from.checkpoint:
        raise ValueError(f"init_from: the spec already has model.init_from "
                         f"({spec.model.init_from.checkpoint!r}); give it in one place")
    result = job_pb2.JobSpec()
    result.CopyFrom(spec)
    result.model.init_from.checkpoint = checkpoint
    if optimizer is not None:
        result.model.init_from.optimizer = optimizer
    return result


def _fix_ints(value, descriptor):
    """Turns the int64 strings of protobuf's JSON mapping in dict `value`
    (of message type `descriptor`) into ints, in place."""
    for name, item in value.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for k in item:
                if value_field.message_type is not None:
                    _fix_ints(item[k], value_field.message_type)
                elif value_field.type in _INT64_TYPES:
                    item[k] = int(item[k])
        elif field.message_type is not None:
            for sub in item if isinstance(item, list) else [item]:
                _fix_ints(sub, field.message_type)
        elif field.type in _INT64_TYPES:
            value[name] = [int(v) for v in item] if isinstance(item, list) else int(item)


def _to_dict(message):
    result = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                       including_default_value_fields=True)
    _fix_ints(result, message.DESCRIPTOR)
    return result


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
    def submit(self, spec, request_id="", *, init_from=None, optimizer=None):
        """Queues a job from a dict, a YAML job file path or a JobSpec;
        returns the Job. A repeated request_id returns the same job.

        init_from: start from the weights of one of your checkpoints, by its
        id ("job-000012/step-400") or a dict that checkpoints() returned; it
        sets the spec's model.init_from (docs/job-spec.md, "Starting from a
        checkpoint"). optimizer: "fresh" (the default: a new AdamW from step
        0) or "restore" (the checkpoint's AdamW moments and step count: the
        job goes on from the checkpoint's step to train.max_steps). Raises
        ValueError for optimizer without init_from, a bad optimizer word, or
        init_from when the spec has one; the daemon's refusals are
        MegatrainError: another user's checkpoint PERMISSION_DENIED, an
        unknown or deleted one NOT_FOUND, each naming
        model.init_from.checkpoint.

        Example:
            last = c.checkpoints("job-000012")[-1]
            c.submit("sft.yaml", init_from=last, optimizer="restore")
        """
        message = job_spec(spec)
        if init_from is not None or optimizer is not None:
            message = _with_init_from(message, init_from, optimizer)
        request = job_pb2.SubmitJobRequest(spec=message, request_id=request_id)
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
        """The job's checkpoints on disk, oldest first: dicts with id
        ("job-000042/step-20"), job_id, step, dir, bytes,
        create_time_unix_ms, write_seconds."""
        response = self._call(self._checkpoints.ListCheckpoints,
                              checkpoint_pb2.ListCheckpointsRequest(job_id=job_id))
        return [_to_dict(c) for c in response.checkpoints]

    def checkpoint_now(self, job_id, timeout_s=600.0):
        """Asks a RUNNING job for a checkpoint at its next step boundary and
        returns it once written (FAILED_PRECONDITION when the job is not
        running; DEADLINE_EXCEEDED after timeout_s)."""
        request = checkpoint_pb2.CreateCheckpointRequest(job_id=job_id)
        return _to_dict(self._call(self._checkpoints.CreateCheckpoint, request,
                                   timeout_s=timeout_s))

    def delete_checkpoint(self, checkpoint_id):
        """Deletes a checkpoint directory (FAILED_PRECONDITION when a queued
        or suspended job will resume from it, or a queued job will start
        from it through model.init_from)."""
        request = checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=checkpoint_id)
        self._call(self._checkpoints.DeleteCheckpoint, request)

    def export(self, checkpoint_id, out_dir, dtype=""):
        """Writes the checkpoint as a HF model directory at out_dir (absolute
        on the daemon's machine; relative: against the working directory).
        Returns {"out_dir", "copied_files", "skipped_files"}: the tokenizer
        and generation files copied from the job's model.hf_dir, and those
        present but not copied, with the reason."""
        request = checkpoint_pb2.ExportCheckpointRequest(
            checkpoint_id=checkpoint_id, out_dir=os.path.abspath(out_dir), dtype=dtype)
        # Export writes the whole model: no unary deadline.
        response = self._call(self._checkpoints.ExportCheckpoint, request, timeout_s=24 * 3600)
        return {"out_dir": response.out_dir, "copied_files": list(response.copied_files),
                "skipped_files": list(response.skipped_files)}

    # -- server -----------------------------------------------------------
    def status(self):
        return _to_dict(self._call(self._server.GetServerStatus, server_pb2.GetServerStatusRequest()))

    def metrics(self, name_prefix=""):
        """The daemon's metrics (what /metrics serves) as {family name:
        {"type", "help", "samples": [{"name", "labels", "value"}]}}, only
        families whose name starts with name_prefix. Per-job series carry a
        "job" label (docs/operations.md, "Metrics")."""
        response = self._call(self._server.GetMetrics,
                              server_pb2.GetMetricsRequest(name_prefix=name_prefix))
        return {f.name: {"type": f.type, "help": f.help,
                         "samples": [{"name": m.name, "labels": dict(m.labels), "value": m.value}
                                     for m in f.samples]}
                for f in response.families}

    def plan(self, spec=None, *, preset=None, hf_dir=None, family=None, params=None,
             machine=None):
        """Where a job's bytes would go (host, pinned, device, NVMe), whether
        it fits, and its projected step time; starts nothing. The model and
        step shape come from `spec` (a job file path, a dict of its keys or
        a JobSpec: model, train and memory are used), or from one of preset,
        hf_dir (its config.json is read here and sent), family + params
        (e.g. "llama", 120e9). machine: a dict of PlanMachine fields
        (host_memory_bytes, gpu_memory_bytes, ...); unset ones are the
        daemon's. Returns the PlanJobResponse as a dict (ints as ints)."""
        request = server_pb2.PlanJobRequest()
        if spec is not None:
            parsed = job_spec(spec)
            request.train.CopyFrom(parsed.train)
            request.memory.CopyFrom(parsed.memory)
            request.nvme_tier = parsed.memory.nvme_tier
            request.memory.ClearField("nvme_tier")
            preset = preset or parsed.model.preset or None
            hf_dir = hf_dir or parsed.model.hf_dir or None
        sources = (preset is not None) + (hf_dir is not None) + (params is not None)
        if sources != 1 or (params is None) != (family is None):
            raise ValueError("plan: give exactly one of a spec's model, preset, hf_dir, "
                             "and params with family")
        if preset is not None:
            request.model.preset = preset
        elif hf_dir is not None:
            with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
                request.hf_config_json = f.read()
        else:
            request.family, request.param_count = family, float(params)
        errors = []
        _fill(request.machine, machine or {}, "machine", os.getcwd(), errors)
        if errors:
            raise JobSpecError("plan", errors)
        return _to_dict(self._call(self._server.PlanJob, request))


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
