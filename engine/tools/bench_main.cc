// megatrain-bench: the engine's benchmark. Trains on synthetic tokens and
// prints one JSON line; --optimizer_only times the CPU AdamW against
// torch::optim::AdamW. See docs/performance.md.
#include <execinfo.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "engine/tools/bench.h"
#include "engine/runtime/host_buffer.h"
#include "engine/tools/optimizer_bench.h"
#include "engine/runtime/torch_compat.h"
#include "nlohmann/json.hpp"

namespace {

// The crashing thread's frames by glibc's unwinder (the .eh_frame tables,
// which LibTorch and libstdc++ have where they have no frame pointers),
// printed after absl's report (its unwinder stops at such frames).
void PrintUnwoundStack(int signo) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  constexpr char kHeader[] = "*** stack by glibc's unwinder:\n";
  (void)!write(2, kHeader, sizeof(kHeader) - 1);
  backtrace_symbols_fd(frames, n, 2);
}

void InstallCrashReports(const char* argv0) {
  void* warm[1];
  (void)backtrace(warm, 1);  // loads libgcc_s now, not inside a signal handler
  for (const int signo : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    std::signal(signo, PrintUnwoundStack);
  }
  absl::InitializeSymbolizer(argv0);
  absl::FailureSignalHandlerOptions options;
  options.call_previous_handler = true;  // then PrintUnwoundStack
  absl::InstallFailureSignalHandler(options);
}

// Modes beside the training benchmark.
struct OtherModes {
  bool optimizer_only = false;  // time CPU AdamW vs torch::optim::AdamW
  int64_t params = 50'000'000;  // parameters for --optimizer_only
  int bf16_offset = 0;          // --optimizer_only: bf16 copy misalignment
  double pinned_gib = 0;        // > 0: only time pinning this many GiB
};

void AddTrainingOptions(CLI::App& app, megatrain::engine::BenchOptions& o) {
  app.add_option("--model", o.model,
                 "preset (tiny, llama-1b, llama-3b, llama-8b, gemma2-2b, phi3-mini, qwen3-moe-7b, "
                 "mixtral-7b, qwen3-moe-4b, mixtral-4b) or HF model dir");
  app.add_option("--device", o.device, "cpu | cuda | cuda:N");
  app.add_option("--micro_batch", o.micro_batch, "sequences per forward/backward");
  app.add_option("--seq_len", o.seq_len, "tokens per sequence");
  app.add_option("--document_tokens", o.document_tokens,
                 "> 0: each sequence packs isolated documents of this many tokens "
                 "(data.packing.document_attention: isolated; docs/job-spec.md, \"Packing\")")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gradient_accumulation_steps", o.gradient_accumulation_steps,
                 "micro-batches per step");
  app.add_option("--devices", o.devices,
                 "data-parallel devices, each running --gradient_accumulation_steps micro-batches "
                 "(cuda: cuda:0..N-1; docs/distributed.md)")
      ->check(CLI::Range(1, 64));
  app.add_option("--dist", o.dist,
                 "env: one process of a multi-process (multi-host) run, joined through torchrun's "
                 "MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK (docs/distributed.md)");
  app.add_option("--gradient_reduction", o.gradient_reduction,
                 "auto | host_all_reduce | device_reduce_scatter (data parallel)");
  app.add_option("--shard_weights", o.shard_weights,
                 "data parallel: each device loads 1/N of a streamed block and gathers the rest "
                 "over the peer links (default true)");
  app.add_option("--peer_copies", o.peer_copies,
                 "data parallel on CUDA: collectives as copy-engine peer copies (default false: "
                 "NCCL kernels; not yet validated on a GPU)");
  app.add_option("--collective_timeout_s", o.collective_timeout_s,
                 "data parallel: seconds a rank waits for the others at a collective before the "
                 "run fails (default 600)")
      ->check(CLI::Range(1, 86400));
  app.add_option("--host_memory_budget", o.host_memory_budget,
                 "bytes of host memory the run may hold: a larger footprint is refused before "
                 "anything is allocated (0: not checked)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--steps", o.steps, "measured optimizer steps");
  app.add_option("--warmup", o.warmup, "unmeasured steps first");
  app.add_option("--compute_dtype", o.compute_dtype, "fp32 | tf32 | bf16");
  app.add_option("--data", o.data, "fixed (one random batch repeated) | random");
  app.add_option("--lr", o.lr, "AdamW learning rate (constant)");
  app.add_option("--max_grad_norm", o.max_grad_norm,
                 "global-norm clipping (0: off, as the baselines)");
  app.add_option("--peak_tflops", o.peak_tflops,
                 "one device's dense bf16 peak TFLOP/s for MFU (0: the datasheet peak of "
                 "the device, 989 for H100/H200; MFU omitted when unknown)");
  app.add_option("--threads", o.threads, "CPU threads (0: all)");
  app.add_option("--weight_slots", o.num_weight_slots, "device weight buffers (>= 3)");
  app.add_option("--seed", o.seed, "weight and data seed");
  app.add_flag("--offload_activations", o.offload_activations,
               "keep saved layer inputs in pinned host memory (long sequences)");
  app.add_option("--kernel_trace", o.kernel_trace,
                 "write a Kineto trace (Chrome JSON) of the last measured step here (torch >= 2)");
  app.add_flag("--json", o.json, "print only the final JSON line on stdout");
}

// The trainer's scheduling and placement knobs.
void AddTrainerKnobs(CLI::App& app, megatrain::engine::BenchOptions& o) {
  app.add_option(
      "--optimizer_nice", o.optimizer_nice,
      "nice value of the CPU AdamW threads (> 0: critical-path host work preempts them)");
  app.add_option("--critical_threads", o.critical_threads,
                 "threads for host work on the GPU's critical path (0: all cores, <= 16)");
  app.add_option(
      "--optimizer_slice_elements", o.optimizer_slice_elements,
      "parameters per queued AdamW task (the next forward's block waits for at most one)");
  app.add_option("--loss_chunk_tokens", o.loss_chunk_tokens,
                 "rows of logits per loss chunk (0: auto, about 1 GiB of fp32 logits)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--fused_kernels", o.fused_kernels,
                 "auto | on | off: the fused elementwise kernels on CUDA bf16 (auto: on in "
                 "CUDA builds; on: refused by a build without them)")
      ->capture_default_str();
  app.add_option("--activation_checkpointing", o.activation_checkpointing,
                 "auto | all: auto keeps the forward graph of the resident dense layers that "
                 "fit the device (no recompute in their backward); all recomputes every layer")
      ->capture_default_str();
  app.add_option("--resident_layers", o.resident_layers,
                 "decoder layers kept on the device with their AdamW state (-1: auto, 2 on CUDA)");
  app.add_option("--resident_embedding", o.resident_embedding,
                 "embedding table kept on the device with its AdamW state (-1: auto, on CUDA "
                 "when untied and its 16 B/parameter fit 1/8 of device memory; 0 off; 1 on)")
      ->check(CLI::Range(-1, 1));
  app.add_option("--device_grad_accumulation", o.device_grad_accumulation,
                 "sum the streamed gradients of a step's micro-batches on the device (-1: auto, "
                 "on CUDA when their fp32 bytes fit 1/4 of device memory; 0 off; 1 on)")
      ->check(CLI::Range(-1, 1));
  app.add_option("--cuda_graphs", o.cuda_graphs,
                 "replay dense decoder layers from CUDA graphs (-1: auto, on CUDA when a "
                 "micro-batch has at most 4096 tokens; 0 off; 1 on)")
      ->check(CLI::Range(-1, 1));
  app.add_option("--embedding_lookahead", o.embedding_lookahead,
                 "give each step the next batch's token ids, so the embedding rows it reads "
                 "are updated off the critical path (true | false)");
  app.add_option("--schedule", o.schedule,
                 "order of a step's work: auto (layer-major on CUDA with accumulation > 1), "
                 "micro-batch-major or layer-major (each layer fetched once per wave)")
      ->check(CLI::IsMember({"auto", "micro-batch-major", "layer-major"}));
  app.add_option("--wave", o.wave,
                 "layer-major micro-batches per wave (0: auto, all of the step when they fit)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--activations", o.activations,
                 "where saved layer inputs live: auto (device when the wave fits), device, host")
      ->check(CLI::IsMember({"auto", "device", "host"}));
  app.add_option("--nvme_tier", o.nvme_tier,
                 "off, or moments: the AdamW moments in files under --nvme_dir (a fresh "
                 "subdirectory, removed at the end; docs/operations.md \"The NVMe tier\")")
      ->check(CLI::IsMember({"off", "moments"}));
  app.add_option("--nvme_dir", o.nvme_dir, "directory on a local SSD for --nvme_tier moments");
  app.add_option("--weight_stream", o.weight_stream,
                 "bf16 compute: stream a bf16 copy kept in host memory (bf16, the default), "
                 "the fp32 master cast on the device (fp32: 2 bytes/param less host memory, "
                 "twice the weight H2D bytes) or the fp32 master cast by CPU threads into "
                 "pinned staging (host_cast: the host memory of fp32 plus one block of staging, "
                 "the H2D bytes of bf16); the same results")
      ->check(CLI::IsMember({"bf16", "fp32", "host_cast"}));
  app.add_option("--gradient_landing", o.gradient_landing,
                 "where gradients land: arena (fp32, 4 bytes/param), ring (a bounded pinned ring "
                 "the optimizer consumes; needs --max_grad_norm 0) or auto")
      ->check(CLI::IsMember({"arena", "ring", "auto"}));
}

void AddOtherModes(CLI::App& app, OtherModes& m) {
  app.add_flag("--optimizer_only", m.optimizer_only, "time CPU AdamW vs torch::optim::AdamW");
  app.add_option("--params", m.params, "parameters for --optimizer_only");
  app.add_option("--bf16_offset", m.bf16_offset,
                 "--optimizer_only: bf16 copy this many elements past a 64-byte boundary "
                 "(1: plain stores instead of streaming ones, for an A/B)")
      ->check(CLI::Range(0, 31));
  app.add_option("--pinned_gib", m.pinned_gib,
                 "only time allocating and registering (pinning) this many GiB of host memory");
}

int RunPinnedOnly(double pinned_gib) {
  const auto start = std::chrono::steady_clock::now();
  auto buffer = megatrain::engine::HostBuffer::Allocate(
      static_cast<size_t>(pinned_gib * (1ull << 30)), /*pin=*/true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!buffer.ok()) {
    std::fprintf(stderr, "megatrain-bench: %s\n", buffer.status().ToString().c_str());
    return 1;
  }
  nlohmann::json j;
  j["pinned_bytes"] = buffer->bytes();
  j["allocate_and_register_seconds"] = seconds;
  j["gib_per_s"] = pinned_gib / seconds;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int RunOptimizerOnly(const OtherModes& m, int threads) {
  megatrain::engine::OptimizerBenchOptions opt;
  opt.params = m.params;
  opt.threads = threads;
  opt.bf16_offset_elements = m.bf16_offset;
  auto r = megatrain::engine::RunOptimizerBenchmark(opt);
  if (!r.ok()) {
    std::fprintf(stderr, "megatrain-bench: %s\n", r.status().ToString().c_str());
    return 1;
  }
  nlohmann::json j;
  j["params"] = r->params;
  j["threads"] = r->threads;
  j["torch_threads"] = r->torch_threads;
  j["kernel"] = r->kernel_variant;
  j["adamw_seconds_per_step"] = r->adamw_seconds_per_step;
  j["adamw_params_per_s"] = r->adamw_params_per_s;
  j["torch_adamw_seconds_per_step"] = r->torch_adamw_seconds_per_step;
  j["torch_adamw_params_per_s"] = r->torch_adamw_params_per_s;
  j["speedup"] = r->speedup;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A crash (SIGSEGV, SIGABRT, ...) prints the crashing thread's stack on
  // stderr before the process dies.
  InstallCrashReports(argv[0]);
  megatrain::engine::compat::PreferExpandableSegments();  // Note [Expandable segments]
  megatrain::engine::BenchOptions o;
  OtherModes modes;
  CLI::App app{"megatrain-bench: streamed training throughput on synthetic tokens"};
  app.set_version_flag("--version", std::string("megatrain-bench ") + MEGATRAIN_VERSION);
  AddTrainingOptions(app, o);
  AddTrainerKnobs(app, o);
  AddOtherModes(app, modes);
  CLI11_PARSE(app, argc, argv);

  if (modes.pinned_gib > 0) return RunPinnedOnly(modes.pinned_gib);
  if (modes.optimizer_only) return RunOptimizerOnly(modes, o.threads);
  auto result = megatrain::engine::RunTrainingBenchmark(o);
  if (!result.ok()) {
    std::fprintf(stderr, "megatrain-bench: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", result->c_str());
  return 0;
}
