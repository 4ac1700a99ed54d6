"""megatrain_client without a daemon: job specs from dicts and YAML (every
bad field reported at once, by its YAML path and the job file's words),
results as dicts with ints, and plan()'s arguments. The stubs are
generated from proto/ into a temporary cache (Debian's protoc and
grpc_python_plugin). The calls against a real daemon are
tests/integration/python_client_test.sh.

    python3 tests/python/client_test.py   (from the source root)
"""
import os
import sys
import tempfile
import unittest

os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="megatrain-client-test.")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from megatrain_client import Client, JobSpecError, job_spec  # noqa: E402
from megatrain_client.client import _to_dict, _with_init_from, job_pb2, server_pb2  # noqa: E402


class JobSpecTest(unittest.TestCase):
    def test_dict_becomes_a_job_spec_with_absolute_paths_and_enum_words(self):
        spec = job_spec({"model": {"preset": "tiny"}, "data": {"tokens": "data/tiny"},
                         "train": {"micro_batch": 8, "compute_dtype": "bf16", "devices": "all",
                                   "resident_layers": "auto", "nan_policy": "skip"},
                         "labels": {"team": "nlp"}})

        self.assertEqual(spec.data.tokens, os.path.join(os.getcwd(), "data", "tiny"))
        self.assertEqual(spec.train.micro_batch, 8)
        self.assertEqual(spec.train.compute_dtype, job_pb2.COMPUTE_DTYPE_BF16)
        self.assertEqual(spec.train.nan_policy, job_pb2.NAN_POLICY_SKIP)
        self.assertTrue(spec.train.HasField("devices"))
        self.assertEqual(spec.train.devices, 0)  # "all"
        self.assertFalse(spec.train.HasField("resident_layers"))  # "auto"
        self.assertEqual(dict(spec.labels), {"team": "nlp"})

    def test_yaml_paths_resolve_against_the_file(self):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "job.yaml")
        with open(path, "w") as f:
            f.write("model: {hf_dir: models/llama}\ndata: {tokens: ../shards}\n")

        spec = job_spec(path)

        self.assertEqual(spec.model.hf_dir, os.path.join(d, "models", "llama"))
        self.assertEqual(spec.data.tokens, os.path.join(os.path.dirname(d), "shards"))

    def test_every_bad_field_is_reported_at_once_by_its_yaml_path(self):
        with self.assertRaises(JobSpecError) as raised:
            job_spec({"train": {"microBatch": 8, "seq_len": "long", "compute_dtype": "fp64",
                                "offload_activations": 1},
                      "optimizer": {"lr": None}, "priority": 2 ** 40, "model": "tiny"})

        errors = raised.exception.errors
        self.assertEqual(len(errors), 7, errors)
        self.assertTrue(errors[0].startswith("train.microBatch: unknown key (known: micro_batch, "))
        self.assertIn("train.seq_len: expected an integer, got 'long'", errors)
        self.assertIn("train.compute_dtype: must be fp32, tf32 or bf16, got 'fp64'", errors)
        self.assertIn("train.offload_activations: expected true or false, got 1", errors)
        self.assertIn("optimizer.lr: missing value", errors)
        self.assertIn("priority: out of range, got 1099511627776", errors)
        self.assertIn("model: expected a mapping of keys, got 'tiny'", errors)
        self.assertNotIn("microBatch", str(raised.exception).replace("train.microBatch:", ""))
        self.assertIsInstance(raised.exception, ValueError)

    def test_preset_and_hf_dir_together_are_refused(self):
        with self.assertRaisesRegex(JobSpecError, "model: give one of preset and hf_dir, not both"):
            job_spec({"model": {"preset": "tiny", "hf_dir": "/m"}})


class InitFromTest(unittest.TestCase):
    """model.init_from as the job file writes it, and submit()'s init_from
    and optimizer arguments (docs/job-spec.md, "Starting from a
    checkpoint")."""

    def test_string_is_the_checkpoint_with_a_fresh_optimizer(self):
        spec = job_spec({"model": {"preset": "tiny", "init_from": "job-000012/step-400"}})

        self.assertEqual(spec.model.init_from.checkpoint, "job-000012/step-400")
        self.assertEqual(spec.model.init_from.optimizer, "")  # the daemon's default: fresh

    def test_mapping_sets_checkpoint_and_optimizer(self):
        spec = job_spec({"model": {"init_from": {"checkpoint": "job-000012/step-400",
                                                 "optimizer": "restore"}}})

        self.assertEqual(spec.model.init_from.checkpoint, "job-000012/step-400")
        self.assertEqual(spec.model.init_from.optimizer, "restore")

    def test_bad_optimizer_and_missing_checkpoint_are_reported_by_yaml_path(self):
        with self.assertRaises(JobSpecError) as raised:
            job_spec({"model": {"init_from": {"optimizer": "keep"}}})

        self.assertEqual(raised.exception.errors, [
            "model.init_from.optimizer: must be fresh or restore, got 'keep'",
            "model.init_from.checkpoint: required"])

    def test_submit_arguments_set_init_from_on_a_copy(self):
        original = job_spec({"model": {"preset": "tiny"}})

        spec = _with_init_from(original, {"id": "job-000001/step-4", "step": 4}, "restore")

        self.assertEqual(spec.model.init_from.checkpoint, "job-000001/step-4")
        self.assertEqual(spec.model.init_from.optimizer, "restore")
        self.assertEqual(spec.model.preset, "tiny")
        self.assertFalse(original.model.HasField("init_from"))  # the caller's spec is untouched
        self.assertEqual(_with_init_from(original, "job-000001/step-4", None)
                         .model.init_from.optimizer, "")

    def test_submit_arguments_refuse_what_they_cannot_mean(self):
        tiny = job_spec({"model": {"preset": "tiny"}})
        with_one = job_spec({"model": {"preset": "tiny", "init_from": "job-000001/step-4"}})

        with self.assertRaisesRegex(ValueError, "optimizer: given without init_from"):
            _with_init_from(tiny, None, "restore")
        with self.assertRaisesRegex(ValueError, "optimizer: must be fresh or restore, got 'keep'"):
            _with_init_from(tiny, "job-000001/step-4", "keep")
        with self.assertRaisesRegex(ValueError, "init_from: expected a checkpoint id"):
            _with_init_from(tiny, {"step": 4}, None)
        with self.assertRaisesRegex(ValueError, "the spec already has model.init_from"):
            _with_init_from(with_one, "job-000001/step-8", None)


class ResultTest(unittest.TestCase):
    def test_int64_fields_are_ints_and_defaults_present(self):
        job = job_pb2.Job(id="job-000001", host_memory_bytes=1 << 40,
                          progress=job_pb2.JobProgress(step=4, tokens=8192))

        d = _to_dict(job)

        self.assertEqual(d["host_memory_bytes"], 1 << 40)
        self.assertIsInstance(d["progress"]["step"], int)
        self.assertEqual(d["progress"]["tokens"], 8192)
        self.assertEqual(d["queue_position"], 0)
        self.assertNotIn("eval_loss", d["progress"])  # optional, unset
        self.assertNotIn("mfu", d["progress"])

    def test_maps_and_repeated_messages_convert_their_ints(self):
        response = server_pb2.PlanJobResponse(params=7, machine=server_pb2.PlanMachine(
            host_memory_bytes=123))
        listed = job_pb2.ListJobsResponse(jobs=[job_pb2.Job(create_time_unix_ms=5)])

        self.assertEqual(_to_dict(response)["machine"]["host_memory_bytes"], 123)
        self.assertEqual(_to_dict(listed)["jobs"][0]["create_time_unix_ms"], 5)


class PlanArgumentsTest(unittest.TestCase):
    def test_plan_needs_exactly_one_model(self):
        with Client("127.0.0.1:1") as c:
            with self.assertRaisesRegex(ValueError, "give exactly one of"):
                c.plan(preset="tiny", family="llama", params=1e9)
            with self.assertRaisesRegex(JobSpecError, "machine.host_memory_bytes: expected an "
                                                      "integer"):
                c.plan(preset="tiny", machine={"host_memory_bytes": "lots"})


if __name__ == "__main__":
    unittest.main()
