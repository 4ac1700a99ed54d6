"""megatrain_client: a thin Python client of megatraind (docs/api.md).

    from megatrain_client import Client
    with Client("127.0.0.1:50051", token="...") as c:
        job = c.submit("examples/jobs/tiny.yaml")
        final = c.wait(job["id"])          # progress bar on stderr
        print(final["state"], c.checkpoints(job["id"]))
        c.export(c.checkpoints(job["id"])[-1]["id"], "out/hf")

Errors are MegatrainError (with the gRPC status code and message); a bad
job spec is JobSpecError naming every bad field by its YAML path. Install:
`pip install client/python` (docs/api.md, "Python client").
"""
__all__ = ["Client", "JobSpecError", "MegatrainError", "job_spec"]


def __getattr__(name):
    # Lazy (PEP 562): megatrain_client.chat_template needs only jinja2, not
    # grpc and the generated stubs.
    if name in __all__:
        from megatrain_client import client
        return getattr(client, name)
    raise AttributeError(f"module 'megatrain_client' has no attribute '{name}'")
