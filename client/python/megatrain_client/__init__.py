"""megatrain_client: a thin Python client of megatraind (docs/api.md).

    from megatrain_client import Client
    with Client("127.0.0.1:50051", token="...") as c:
        job = c.submit("examples/jobs/tiny.yaml")
        final = c.wait(job["id"])          # progress bar on stderr
        print(final["state"], c.checkpoints(job["id"]))

Errors are MegatrainError (with the gRPC status code and message).
"""
from megatrain_client.client import Client, MegatrainError, job_spec

__all__ = ["Client", "MegatrainError", "job_spec"]
