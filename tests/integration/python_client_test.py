"""Driven by python_client_test.sh against a real megatraind: every call of
megatrain_client (submit from a dict and from YAML, wait with progress,
list, get, suspend, resume, cancel, checkpoints, export, status) and its
errors (gRPC code and message on MegatrainError).

    python_client_test.py ADDR TOKEN OTHER_TOKEN TINY_DATA WORK_DIR
"""
import io
import os
import sys

import grpc

from megatrain_client import Client, MegatrainError, job_spec

addr, token, other_token, tiny_data, work = sys.argv[1:6]


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}", flush=True)


def expect_error(code, substring, fn, *args):
    try:
        fn(*args)
    except MegatrainError as e:
        check(e.code == code and substring in e.message,
              f"{fn.__name__} raises {code.name} with '{substring}' (got {e})")
        return
    raise SystemExit(f"FAIL: {fn.__name__}{args} did not raise")


def spec(name, max_steps):
    return {"name": name, "model": {"preset": "tiny"}, "data": {"tokens": tiny_data},
            "train": {"micro_batch": 8, "seq_len": 128, "max_steps": max_steps,
                      "compute_dtype": "fp32"},
            "optimizer": {"lr": 3.0e-3, "warmup_steps": 5},
            "checkpoint": {"every_steps": 20, "keep_last": 2}}


with Client(addr, token=token, timeout_s=120) as c:
    status = c.status()
    check("devices" in status or "queue" in status or status != {}, "status() returns the server status")

    job = c.submit(spec("py-tiny", 40), request_id="py-1")
    check(job["id"].startswith("job-"), f"submit() from a dict: {job['id']}")
    again = c.submit(spec("py-tiny", 40), request_id="py-1")
    check(again["id"] == job["id"], "a repeated request_id returns the same job")
    bar = io.StringIO()
    final = c.wait(job["id"], file=bar)
    check(final["state"] == "JOB_STATE_SUCCEEDED", f"wait() ends SUCCEEDED ({final['state']})")
    check(int(final["progress"]["step"]) == 40, "progress.step is 40")
    check("step 40/40" in bar.getvalue(), "wait() drew a progress bar")

    ckpts = c.checkpoints(job["id"])
    check(len(ckpts) >= 1 and ckpts[-1]["id"] == job["id"] + "/step-40", f"checkpoints(): {[k['id'] for k in ckpts]}")
    out = c.export(ckpts[-1]["id"], os.path.join(work, "out", "hf"))
    check(os.path.isfile(os.path.join(out, "config.json")), "export() wrote config.json")

    listed = c.list()
    check(any(j["id"] == job["id"] for j in listed), "list() shows the job")
    check(all(j["state"] == "JOB_STATE_SUCCEEDED" for j in c.list(states=["SUCCEEDED"])),
          "list(states=...) filters")

    # A YAML job file: relative paths resolve against its directory.
    yaml_path = os.path.join(work, "long.yaml")
    with open(yaml_path, "w") as f:
        f.write(f"name: py-long\nmodel: {{preset: tiny}}\ndata: {{tokens: {os.path.relpath(tiny_data, work)}}}\n"
                "train: {micro_batch: 8, seq_len: 128, max_steps: 100000}\n"
                "checkpoint: {every_steps: 1000}\n")
    check(job_spec(yaml_path).data.tokens == os.path.normpath(tiny_data),
          "job_spec() resolves YAML paths against the file")
    long = c.submit(yaml_path)
    for event in c.watch(long["id"]):
        if "step" in event and int(event["step"]["step"]) >= 2:
            break
    check(c.suspend(long["id"])["state"] in ("JOB_STATE_SUSPENDING", "JOB_STATE_SUSPENDED"), "suspend()")
    for event in c.watch(long["id"]):
        if event.get("state_change", {}).get("state") == "JOB_STATE_SUSPENDED":
            break
    check(c.get(long["id"])["state"] == "JOB_STATE_SUSPENDED", "the job is SUSPENDED")
    check(c.resume(long["id"])["state"] in ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING"), "resume()")
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, "only SUSPENDED jobs resume", c.resume,
                 long["id"])
    c.cancel(long["id"], force=True)
    final = c.wait(long["id"], progress=False)
    check(final["state"] == "JOB_STATE_CANCELLED", "cancel(force=True) ends CANCELLED")
    check(not final.get("error_message"), "no status text in error_message")

    expect_error(grpc.StatusCode.NOT_FOUND, "job-999999", c.get, "job-999999")
    bad = spec("bad", 10)
    bad["train"]["micro_batch"] = 0
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "micro_batch", c.submit, bad)
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, "", c.cancel, job["id"])
    try:
        job_spec({"train": {"no_such_field": 1}})
        raise SystemExit("FAIL: unknown key accepted")
    except ValueError as e:
        check("no_such_field" in str(e), f"job_spec() names an unknown key ({e})")

with Client(addr, token="wrong") as c:
    expect_error(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token", c.status)
with Client(addr, token=other_token) as c:
    expect_error(grpc.StatusCode.PERMISSION_DENIED, "", c.get, job["id"])
print("python client: all checks passed")
