// `megatrain plan` (plan_command.h).
#include "client/plan_command.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"

namespace megatrain::client {
namespace {

// Splits "1.5TB" into 1.5 and "TB"; false when no number leads.
bool SplitNumber(const std::string& text, double* value, std::string* unit) {
  size_t end = 0;
  while (end < text.size() && (absl::ascii_isdigit(text[end]) || text[end] == '.' ||
                               text[end] == 'e' || text[end] == '-' || text[end] == '+')) {
    // An 'e' only as an exponent: followed by a digit or sign.
    if (text[end] == 'e' && (end + 1 >= text.size() || absl::ascii_isalpha(text[end + 1]))) break;
    ++end;
  }
  if (!absl::SimpleAtod(text.substr(0, end), value)) return false;
  *unit = text.substr(end);
  return std::isfinite(*value) && *value >= 0;
}

std::string Gb(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= 1e12 ? absl::StrFormat("%.2f TB", b / 1e12) : absl::StrFormat("%.1f GB", b / 1e9);
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text) {
  double value = 0;
  std::string unit;
  if (SplitNumber(text, &value, &unit)) {
    if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
    static const std::pair<const char*, double> kUnits[] = {
        {"", 1},           {"K", 1e3},           {"M", 1e6},
        {"G", 1e9},        {"T", 1e12},          {"Ki", 1024.0},
        {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}};
    for (const auto& [name, scale] : kUnits) {
      if (unit == name && value * scale < 9e18) return static_cast<int64_t>(value * scale);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": expected a size such as 1.5TB, 125GiB or 4e12 bytes, got '", text, "'"));
}

absl::StatusOr<double> ParseParamCount(const std::string& flag, const std::string& text) {
  double value = 0;
  std::string unit;
  if (SplitNumber(text, &value, &unit)) {
    static const std::pair<const char*, double> kUnits[] = {
        {"", 1}, {"M", 1e6}, {"B", 1e9}, {"T", 1e12}};
    for (const auto& [name, scale] : kUnits) {
      if (unit == name) return value * scale;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": expected a parameter count such as 120B or 70e9, got '", text, "'"));
}

CLI::App* AddPlanCommand(CLI::App* app, PlanArgs* a) {
  CLI::App* plan = app->add_subcommand(
      "plan",
      "Where a job's bytes would go (host, pinned, device, NVMe), whether it fits, and "
      "its projected step time");
  plan->add_option("--preset", a->preset, "Model preset (llama-8b, ...)");
  plan->add_option("--hf_dir", a->hf_dir, "HF model directory (its config.json is sent)");
  plan->add_option("--family", a->family, "Model family for --params (llama)");
  plan->add_option("--params", a->params, "Parameter count for --family (120B, 70e9)");
  plan->add_option("--micro_batch", a->micro_batch, "Sequences per forward/backward");
  plan->add_option("--seq_len", a->seq_len, "Tokens per sequence");
  plan->add_option("--gradient_accumulation_steps", a->gradient_accumulation_steps,
                   "Micro-batches per step");
  plan->add_option("--devices", a->devices,
                   "train.devices: GPUs of one host training data-parallel (1..64)");
  plan->add_option("--dtype", a->dtype, "Compute dtype: fp32, tf32 or bf16");
  plan->add_option("--max_grad_norm", a->max_grad_norm, "Clipping threshold (0: off)");
  plan->add_flag("--offload_activations", a->offload_activations, "Activation offload");
  plan->add_option("--nvme_tier", a->nvme_tier, "memory.nvme_tier: off, moments or auto");
  plan->add_option("--weight_stream", a->weight_stream,
                   "memory.weight_stream: bf16 (a bf16 host copy, the default), fp32 (the "
                   "master, cast on the device) or host_cast (the master, cast by CPU threads "
                   "into pinned staging)");
  plan->add_option("--gradient_landing", a->gradient_landing,
                   "memory.gradient_landing: arena, ring or auto");
  plan->add_option("--host_memory", a->host_memory, "Host memory (default: the daemon's budget)");
  plan->add_option("--nvme", a->nvme, "NVMe tier size (default: the daemon's --nvme_budget)");
  plan->add_option("--gpu_memory", a->gpu_memory, "GPU memory (default: the daemon's device)");
  plan->add_option("--h2d_gbps", a->h2d_gb_per_s, "H2D GB/s (default: measured by the daemon)");
  plan->add_option("--d2h_gbps", a->d2h_gb_per_s, "D2H GB/s (default: measured by the daemon)");
  plan->add_option("--matmul_tflops", a->matmul_tflops, "bf16 matmul peak, TFLOP/s");
  plan->add_option("--adamw_gparams", a->adamw_gparams_per_s, "CPU AdamW, G params/s");
  plan->add_option("--nvme_read_gbps", a->nvme_read_gb_per_s, "NVMe read GB/s");
  plan->add_option("--nvme_write_gbps", a->nvme_write_gb_per_s, "NVMe write GB/s");
  return plan;
}

absl::StatusOr<v1::PlanJobRequest> PlanRequestFromArgs(const PlanArgs& a) {
  v1::PlanJobRequest request;
  const int sources = !a.preset.empty() + !a.hf_dir.empty() + !a.params.empty();
  if (sources != 1 || a.params.empty() != a.family.empty()) {
    return absl::InvalidArgumentError(
        "plan: give exactly one of --preset, --hf_dir, and --params with --family");
  }
  request.mutable_model()->set_preset(a.preset);
  if (!a.hf_dir.empty()) {
    const std::string path = a.hf_dir + "/config.json";
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("--hf_dir: cannot read ", path));
    std::stringstream text;
    text << in.rdbuf();
    request.set_hf_config_json(text.str());
  }
  if (!a.params.empty()) {
    absl::StatusOr<double> params = ParseParamCount("--params", a.params);
    if (!params.ok()) return params.status();
    request.set_family(a.family);
    request.set_param_count(*params);
  }
  v1::TrainSpec* train = request.mutable_train();
  if (a.micro_batch) train->set_micro_batch(*a.micro_batch);
  if (a.devices) train->set_devices(*a.devices);
  if (a.seq_len) train->set_seq_len(*a.seq_len);
  if (a.gradient_accumulation_steps) {
    train->set_gradient_accumulation_steps(*a.gradient_accumulation_steps);
  }
  if (a.dtype == "bf16") {
    train->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  } else if (a.dtype == "tf32") {
    train->set_compute_dtype(v1::COMPUTE_DTYPE_TF32);
  } else if (a.dtype == "fp32" || a.dtype.empty()) {
    train->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: must be fp32, tf32 or bf16, got '", a.dtype, "'"));
  }
  if (a.max_grad_norm) train->set_max_grad_norm(*a.max_grad_norm);
  if (a.offload_activations) train->set_offload_activations(true);
  request.set_nvme_tier(a.nvme_tier);
  if (!a.weight_stream.empty()) request.mutable_memory()->set_weight_stream(a.weight_stream);
  if (!a.gradient_landing.empty()) {
    request.mutable_memory()->set_gradient_landing(a.gradient_landing);
  }
  v1::PlanMachine* m = request.mutable_machine();
  const std::pair<const std::string*, void (v1::PlanMachine::*)(int64_t)> sizes[] = {
      {&a.host_memory, &v1::PlanMachine::set_host_memory_bytes},
      {&a.nvme, &v1::PlanMachine::set_nvme_bytes},
      {&a.gpu_memory, &v1::PlanMachine::set_gpu_memory_bytes}};
  const char* size_flags[] = {"--host_memory", "--nvme", "--gpu_memory"};
  for (int i = 0; i < 3; ++i) {
    if (sizes[i].first->empty()) continue;
    absl::StatusOr<int64_t> bytes = ParseByteSize(size_flags[i], *sizes[i].first);
    if (!bytes.ok()) return bytes.status();
    (m->*sizes[i].second)(*bytes);
  }
  if (a.h2d_gb_per_s) m->set_h2d_bytes_per_second(*a.h2d_gb_per_s * 1e9);
  if (a.d2h_gb_per_s) m->set_d2h_bytes_per_second(*a.d2h_gb_per_s * 1e9);
  if (a.matmul_tflops) m->set_matmul_flops_per_second(*a.matmul_tflops * 1e12);
  if (a.adamw_gparams_per_s) m->set_adamw_params_per_second(*a.adamw_gparams_per_s * 1e9);
  if (a.nvme_read_gb_per_s) m->set_nvme_read_bytes_per_second(*a.nvme_read_gb_per_s * 1e9);
  if (a.nvme_write_gb_per_s) m->set_nvme_write_bytes_per_second(*a.nvme_write_gb_per_s * 1e9);
  return request;
}

std::string PlanText(const v1::PlanJobResponse& plan) {
  const v1::StepProjection& p = plan.projection();
  const v1::PlanMachine& m = plan.machine();
  std::string text = absl::StrFormat(
      "params       %.2f B\n"
      "nvme_tier    %s\n"
      "host         %s (%s pinned) of %s\n"
      "device       %s of %s\n"
      "nvme         %s of %s\n"
      "%s\n",
      static_cast<double>(plan.params()) / 1e9, plan.nvme_tier(), Gb(plan.host_bytes()),
      Gb(plan.pinned_bytes()), Gb(m.host_memory_bytes()), Gb(plan.device_bytes()),
      Gb(m.gpu_memory_bytes()), Gb(plan.nvme_bytes()), Gb(m.nvme_bytes()), plan.verdict());
  if (plan.devices() > 1) {
    absl::StrAppendFormat(&text,
                          "devices      %d GPUs, data parallel: device bytes, the step's terms "
                          "and MFU are one GPU's; tokens/s the job's\n",
                          plan.devices());
  }
  absl::StrAppendFormat(&text,
                        "step         %.3f s projected (%s-bound), %.0f tokens/s, MFU %.1f%%\n"
                        "  compute %.3f s, h2d %.3f s, d2h %.3f s, adamw %.3f s, nvme %.3f s\n"
                        "machine      %s\n",
                        p.step_seconds(), p.bound(), p.tokens_per_second(), 100 * p.mfu(),
                        p.compute_seconds(), p.h2d_seconds(), p.d2h_seconds(), p.adamw_seconds(),
                        p.nvme_seconds(), m.description());
  return text;
}

int RunPlan(const PlanArgs& args, Connection& connection, absl::Duration timeout, bool json,
            std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::PlanJobRequest> request = PlanRequestFromArgs(args);
  if (!request.ok()) {
    err << "megatrain: " << absl::StatusCodeToString(request.status().code()) << ": "
        << request.status().message() << "\n";
    return kExitUsage;
  }
  v1::PlanJobResponse plan;
  const absl::Status status = FromGrpcStatus(
      connection.server().PlanJob(connection.NewContext(timeout).get(), *request, &plan));
  if (!status.ok()) {
    err << "megatrain: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
        << "\n";
    return ExitCodeFor(status.code());
  }
  if (json) {
    std::string text;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(plan, &text, options);
    out << text;
  } else {
    out << PlanText(plan);
  }
  return kExitOk;
}

}  // namespace megatrain::client
