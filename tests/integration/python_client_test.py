"""Driven by python_client_test.sh against a real megatraind, with the
installed package: every call of megatrain_client (plan, submit from a dict
and from YAML, wait with progress, list, get, suspend, resume, cancel,
checkpoints, checkpoint_now, delete_checkpoint, export, metrics, status,
submit with init_from),
integers as ints, its errors (gRPC code and message on MegatrainError; a
bad spec's every field by YAML path on JobSpecError), and an export of a
job trained from a HF directory that keeps its config keys and tokenizer
files and skips a link out of the directory.

    python_client_test.py ADDR TOKEN OTHER_TOKEN TINY_DATA WORK_DIR
"""
import io
import json
import os
import shutil
import sys

import grpc

from megatrain_client import Client, JobSpecError, MegatrainError, job_spec

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

    plan = c.plan(spec("py-plan", 10))
    check(isinstance(plan["params"], int) and plan["params"] > 0, f"plan() params {plan['params']}")
    check(isinstance(plan["host_bytes"], int), "plan() byte counts are ints")
    tib = c.plan(preset="tiny", machine={"host_memory_bytes": 1 << 40})
    check(tib["machine"]["host_memory_bytes"] == 1 << 40 and tib["fits"] is True and tib["verdict"],
          "plan(preset=..., machine=...) uses the machine given")

    job = c.submit(spec("py-tiny", 40), request_id="py-1")
    check(job["id"].startswith("job-"), f"submit() from a dict: {job['id']}")
    again = c.submit(spec("py-tiny", 40), request_id="py-1")
    check(again["id"] == job["id"], "a repeated request_id returns the same job")
    bar = io.StringIO()
    final = c.wait(job["id"], file=bar)
    check(final["state"] == "JOB_STATE_SUCCEEDED", f"wait() ends SUCCEEDED ({final['state']})")
    check(final["progress"]["step"] == 40, "progress.step is the int 40")
    check(isinstance(final["create_time_unix_ms"], int), "int64 fields are ints")
    check("step 40/40" in bar.getvalue(), "wait() drew a progress bar")

    ckpts = c.checkpoints(job["id"])
    check(len(ckpts) >= 1 and ckpts[-1]["id"] == job["id"] + "/step-40", f"checkpoints(): {[k['id'] for k in ckpts]}")
    check(all(isinstance(k["step"], int) and isinstance(k["bytes"], int) for k in ckpts),
          "checkpoint step and bytes are ints")
    # The job's curve files (server/core/job_scalars.h) in its output_dir.
    curves = os.path.join(final["spec"]["output_dir"], "metrics")
    with open(os.path.join(curves, "steps.csv")) as f:
        rows = f.read().splitlines()
    check(rows[0].startswith("step,time_unix_ms,loss,") and len(rows) == 41 and
          rows[-1].startswith("40,"), f"steps.csv has a header and 40 rows ({len(rows)} lines)")
    check(any(n.startswith("events.out.tfevents.") for n in os.listdir(curves)),
          "a TensorBoard event file is written")
    check("mfu" not in final["progress"], "mfu is absent on the CPU, not 0")
    with open(os.path.join(work, "plot-job"), "w") as f:
        f.write(job["id"])
    exported = c.export(ckpts[-1]["id"], os.path.join(work, "out", "hf"))
    out = exported["out_dir"]
    check(os.path.isfile(os.path.join(out, "config.json")), "export() wrote config.json")
    check(exported["copied_files"] == [] and exported["skipped_files"] == [],
          "a preset job's export copies nothing")
    # submit(init_from=, optimizer=): a job from the last checkpoint with its
    # AdamW state goes on from step 41 to its max_steps, 42.
    restored = c.submit(spec("py-init-from", 42), init_from=ckpts[-1], optimizer="restore")
    check(restored["spec"]["model"]["init_from"] ==
          {"checkpoint": ckpts[-1]["id"], "optimizer": "restore"},
          f"submit(init_from=..., optimizer='restore') sets model.init_from ({restored['spec']['model']})")
    final_restored = c.wait(restored["id"], progress=False)
    steps = [e["step"]["step"] for e in c.watch(restored["id"]) if "step" in e]
    check(final_restored["state"] == "JOB_STATE_SUCCEEDED" and steps == [41, 42],
          f"the restored job ran steps 41..42 ({final_restored['state']}, {steps})")
    c.delete_checkpoint(ckpts[0]["id"])
    check(all(k["id"] != ckpts[0]["id"] for k in c.checkpoints(job["id"])), "delete_checkpoint()")

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
        if "step" in event and event["step"]["step"] >= 2:
            break
    made = c.checkpoint_now(long["id"])
    check(made["id"].startswith(long["id"] + "/step-") and made["step"] >= 2,
          f"checkpoint_now() wrote {made['id']}")
    families = c.metrics("megatrain_")
    check("megatrain_jobs" in families and families["megatrain_jobs"]["type"] == "gauge",
          "metrics() returns families by name")
    running = [s for s in families["megatrain_jobs"]["samples"]
               if s["labels"].get("state") == "running"]
    check(running and running[0]["value"] >= 1, "metrics(): one job running")
    job_loss = families.get("megatrain_job_loss", {"samples": []})["samples"]
    check([s["labels"] for s in job_loss] == [{"job_id": long["id"]}],
          f"megatrain_job_loss has the running job only ({job_loss})")
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
    check(not c.metrics("megatrain_job_loss").get("megatrain_job_loss", {"samples": []})["samples"],
          "a job's series are removed when it stops running")
    check(not final.get("error_message"), "no status text in error_message")

    expect_error(grpc.StatusCode.NOT_FOUND, "job-999999", c.get, "job-999999")
    bad = spec("bad", 10)
    bad["train"]["micro_batch"] = 0
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "micro_batch", c.submit, bad)
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, "", c.cancel, job["id"])
    try:
        job_spec({"train": {"no_such_field": 1, "microBatch": 2, "compute_dtype": "fp64"},
                  "optimizer": {"lr": "fast"}})
        raise SystemExit("FAIL: unknown key accepted")
    except JobSpecError as e:
        check(len(e.errors) == 4, f"job_spec() reports every error at once ({e})")
        check(e.errors[0].startswith("train.no_such_field: unknown key (known: micro_batch, "),
              "an unknown key is named by its YAML path, with the YAML names")
        check("microBatch" not in str(e).replace("train.microBatch:", ""),
              "no camelCase names in the message")
        check("train.compute_dtype: must be fp32, tf32 or bf16, got 'fp64'" in e.errors,
              "an enum error lists the job file's words")
        check("optimizer.lr: expected a number, got 'fast'" in e.errors, "a type error names the field")

    # A model directory with tokenizer files: the export keeps them and every
    # config key, and skips a link that leads out of the directory.
    model_dir = os.path.join(work, "model")
    shutil.copytree(out, model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config.update({"initializer_range": 0.1, "pretraining_tp": 1, "custom_key": [1, 2]})
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0"}')
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        f.write('{"chat_template": "{{ messages }}"}')
    with open(os.path.join(work, "outside.json"), "w") as f:
        f.write("{}")
    os.symlink(os.path.join(work, "outside.json"), os.path.join(model_dir, "special_tokens_map.json"))
    hf_spec = spec("py-hf", 6)
    hf_spec["model"] = {"hf_dir": model_dir}
    hf_spec["checkpoint"] = {"every_steps": 3, "keep_last": 1}
    hf_job = c.submit(hf_spec)
    check(c.wait(hf_job["id"], progress=False)["state"] == "JOB_STATE_SUCCEEDED", "the hf_dir job ran")
    hf_out = c.export(c.checkpoints(hf_job["id"])[-1]["id"], os.path.join(work, "out", "hf2"))
    with open(os.path.join(hf_out["out_dir"], "config.json")) as f:
        exported_config = json.load(f)
    dtype_key = "dtype" if "dtype" in config else "torch_dtype"
    check({k: v for k, v in exported_config.items() if k != dtype_key} ==
          {k: v for k, v in config.items() if k != dtype_key},
          "the export keeps model.hf_dir's config.json key for key")
    check(exported_config[dtype_key] == "bfloat16", "with the export's dtype")
    check({"tokenizer.json", "tokenizer_config.json"} <= set(hf_out["copied_files"]),
          f"export() copied the tokenizer files ({hf_out['copied_files']})")
    check(os.path.isfile(os.path.join(hf_out["out_dir"], "tokenizer.json")), "tokenizer.json is there")
    check(any(n.startswith("special_tokens_map.json: ") for n in hf_out["skipped_files"]) and
          not os.path.exists(os.path.join(hf_out["out_dir"], "special_tokens_map.json")),
          f"a link out of model.hf_dir is skipped ({hf_out['skipped_files']})")

with Client(addr, token="wrong") as c:
    expect_error(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token", c.status)
with Client(addr, token=other_token) as c:
    expect_error(grpc.StatusCode.PERMISSION_DENIED, "", c.get, job["id"])
    expect_error(grpc.StatusCode.PERMISSION_DENIED, "model.init_from.checkpoint",
                 lambda: c.submit(spec("py-not-mine", 10), init_from=ckpts[-1]["id"]))
print("python client: all checks passed")
