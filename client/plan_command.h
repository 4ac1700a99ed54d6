// `megatrain plan`: where a job's bytes would go and how long a step would
// take, asked of the daemon (ServerService.PlanJob) before submitting.
//
// Example (one command line):
//   megatrain plan --params 120B --family llama --micro_batch 8 --seq_len 2048
//       --gradient_accumulation_steps 8 --dtype bf16 --host_memory 1.5TB
//       --nvme 4TB --nvme_tier auto
#ifndef MEGATRAIN_CLIENT_PLAN_COMMAND_H_
#define MEGATRAIN_CLIENT_PLAN_COMMAND_H_

#include <optional>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "megatrain/v1/server.pb.h"

namespace megatrain::client {

// The subcommand's flags, as typed (sizes and rates keep their units until
// PlanRequestFromArgs parses them).
struct PlanArgs {
  std::string preset, hf_dir, family, params;
  std::optional<int64_t> micro_batch, seq_len, gradient_accumulation_steps;
  std::optional<int32_t> devices;  // train.devices
  std::string dtype;               // fp32 | tf32 | bf16
  std::optional<double> max_grad_norm;
  bool offload_activations = false;
  std::string nvme_tier;                      // off | moments | auto
  std::string weight_stream;                  // memory.weight_stream (empty: the default)
  std::string gradient_landing;               // memory.gradient_landing (empty: the default)
  std::string host_memory, nvme, gpu_memory;  // bytes: "1.5TB", "125GiB"
  std::optional<double> h2d_gb_per_s, d2h_gb_per_s, matmul_tflops, adamw_gparams_per_s,
      nvme_read_gb_per_s, nvme_write_gb_per_s;
};

// Adds `plan` to `app`, its flags bound to `*args`; returns the subcommand.
CLI::App* AddPlanCommand(CLI::App* app, PlanArgs* args);

// A byte count with an optional unit: "1.5TB" (1.5e12), "125GiB"
// (125 x 2^30), "4e12"; K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti
// (of 1024), B optional. INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text);
// A parameter count: "120B" (1.2e11), "405B", "70e9", "1.5M"; M, B, T for
// millions, billions, trillions. INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<double> ParseParamCount(const std::string& flag, const std::string& text);

// The request for `args`; with --hf_dir, reads <hf_dir>/config.json here
// (NOT_FOUND naming it when missing). INVALID_ARGUMENT naming the flag for
// a bad value or not exactly one model source.
absl::StatusOr<v1::PlanJobRequest> PlanRequestFromArgs(const PlanArgs& args);

// The plan as text: the tiers, the verdict, the projection, the machine.
std::string PlanText(const v1::PlanJobResponse& plan);

// Runs the subcommand: asks the daemon and prints the plan (JSON with
// `json`). Exit codes of cli.h: kExitUsage for a bad flag, ExitCodeFor its
// code for an RPC error, kExitOk otherwise (also when the job does not fit: the
// verdict says so).
int RunPlan(const PlanArgs& args, Connection& connection, absl::Duration timeout, bool json,
            std::ostream& out, std::ostream& err);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_PLAN_COMMAND_H_
