#!/usr/bin/env python3
"""Notebook-style walk through megatrain_client (each `# %%` is a cell):
plan the tiny job, submit it, watch it with a progress bar, read its
per-job metrics, look at its checkpoints, export the last one and start
a next job from it.

    pip install client/python        # or the wheel of deploy/build-python-wheel.sh
    python3 examples/python_client.py --server 127.0.0.1:50051 [--token ...] \
        [--export /tmp/tiny-hf]

(From a checkout without installing: PYTHONPATH=client/python, with protoc
and grpc_python_plugin to generate the stubs.)
"""
import argparse
import os

from megatrain_client import Client, MegatrainError

ap = argparse.ArgumentParser()
ap.add_argument("--server", default=None)
ap.add_argument("--token", default=None)
ap.add_argument("--max_steps", type=int, default=60)
ap.add_argument("--export", default=None, help="directory for the exported HF model")
args = ap.parse_args()

here = os.path.dirname(os.path.abspath(__file__))

# %% Connect (the same token and TLS options as the CLI).
client = Client(args.server, token=args.token)
print("server:", client.status().get("version", "?"))

# %% A job from a dict (the job file's keys; relative paths resolve against
# the working directory) -- or client.submit("examples/jobs/tiny.yaml").
spec = {
    "name": "python-example",
    "model": {"preset": "tiny"},
    "data": {"tokens": os.path.join(here, "jobs", "data", "tiny")},
    "train": {"micro_batch": 8, "seq_len": 128, "max_steps": args.max_steps,
              "compute_dtype": "fp32"},
    "optimizer": {"lr": 3.0e-3, "warmup_steps": 5, "schedule": "cosine"},
    "checkpoint": {"every_steps": 20, "keep_last": 2},
}
# %% Plan it first: where its bytes go and its projected step time.
plan = client.plan(spec)
print("plan:", plan["params"], "params,", plan["host_bytes"], "host bytes, fits:",
      plan.get("fits", False))

job = client.submit(spec)
print("submitted", job["id"])

# %% Watch it to the end with a progress bar.
final = client.wait(job["id"])
print(final["state"], "step", final["progress"]["step"], "loss", final["progress"].get("loss"))

# %% The daemon's metrics (what /metrics serves) as a dict of families.
for name, family in client.metrics("megatrain_jobs").items():
    print(name, [(s["labels"], s["value"]) for s in family["samples"]])

# %% Checkpoints, and an export as a Hugging Face directory.
for ckpt in client.checkpoints(job["id"]):
    print("checkpoint", ckpt["id"], "step", ckpt["step"], ckpt.get("bytes"), "bytes")
if args.export:
    last = client.checkpoints(job["id"])[-1]["id"]
    exported = client.export(last, args.export)
    print("exported to", exported["out_dir"], "copied:", exported["copied_files"])

# %% A next job from the last checkpoint's weights, without exporting
# (model.init_from; optimizer="restore" would also take its AdamW state).
tuned = dict(spec, name="python-example-next",
             train=dict(spec["train"], max_steps=10))
last = client.checkpoints(job["id"])[-1]
nxt = client.submit(tuned, init_from=last, optimizer="fresh")
print("from", last["id"], ":", client.wait(nxt["id"], progress=False)["state"])

# %% Errors carry the gRPC status code and the daemon's message.
try:
    client.get("job-does-not-exist")
except MegatrainError as e:
    print("as expected:", e.code_name, "-", e.message)
client.close()
