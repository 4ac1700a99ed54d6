// Parity harness shared by the CPU and CUDA executor tests: the model
// variants under test, deterministic batches, and one function that runs the
// streaming executor and the reference model (reference_llama.h) on the same
// weights and reports the worst relative error.
#ifndef MEGATRAIN_TESTS_TESTING_PARITY_H_
#define MEGATRAIN_TESTS_TESTING_PARITY_H_

#include <ostream>
#include <string>
#include <vector>

#include "engine/data/batch.h"
#include "engine/model/model_config.h"
#include "engine/model/precision.h"
#include "engine/runtime/stats.h"
#include "engine/step/step_plan.h"

namespace megatrain::testing {

// A small Llama: GQA (4 heads, 2 kv heads), 3 layers, untied.
engine::ModelConfig SmallLlama();

struct Variant {
  std::string name;
  engine::ModelConfig config;
};
inline void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// llama, llama3 (tied, rope scaling, bias), mistral (sliding window),
// qwen2 (qkv bias), qwen3 (q/k norm, head_dim != C/H), gemma2 (soft-capping,
// tied, padding row), gemma3_text (local/global RoPE, q/k norms), phi3
// (fused projections, partial rotary, LongRoPE).
std::vector<Variant> Variants();

// Deterministic micro-batches ([b*t] each) with every 7th label ignored.
std::vector<engine::MicroBatch> MakeBatches(int count, int64_t b, int64_t t, int64_t vocab,
                                            uint32_t seed);

struct ParityResult {
  bool ran = false;             // false when setup failed (a failure is recorded)
  double loss_error = 0;        // |ours - ref| / |ref|
  double worst_grad_error = 0;  // see Note [Near-cancelling gradients]
  std::string worst_grad;       // HF name of the worst tensor
};

// Runs ForwardBackward over `micro_batches` micro-batches of [b, t] on
// `device` and the reference on the concatenated batch. With
// `resident_layers` > 0 the first layers stay on the device (Note [Resident
// layers] in engine/step/executor.h), with `resident_embedding` the embedding
// too (Note [Resident embedding]), and their gradient is read back with
// SyncResidentToStore; with `device_grad_accumulation` micro-batches are
// summed on the device (Note [Device gradient accumulation]).
// `schedule` and `wave` choose the order of work (Note [Layer-major
// schedule] in engine/step/step_plan.h); `cuda_graphs` replays dense
// layers from graphs (Note [Layer graphs]), and then a layer-major pass
// in waves of 3 or more must have replayed some (a failure otherwise);
// `fused_kernels` runs the fused elementwise kernels (Note [Fused kernels]
// in engine/model/fused_math.h) where they apply (bf16 on a GPU);
// resident layers 0..kept_graph_layers-1 keep their forward graph (Note
// [Kept layer graphs] in engine/step/executor.h).
ParityResult RunParity(const engine::ModelConfig& config, const std::string& device,
                       engine::ComputeDtype dtype, double init_range, int micro_batches, int64_t b,
                       int64_t t, bool offload_activations = false, int resident_layers = 0,
                       bool resident_embedding = false, bool device_grad_accumulation = false,
                       engine::StepSchedule schedule = engine::StepSchedule::kMicroBatchMajor,
                       int wave = 1, int64_t mlp_chunk_bytes = 0, bool cuda_graphs = false,
                       bool fused_kernels = false, int kept_graph_layers = 0);

// ExecutorOptions::mlp_chunk_bytes of the parity modes that chunk the MLP
// (Note [Chunked MLP] in engine/model/layers.h): with the variants'
// intermediate_size 112 and micro-batches of [2, 12], 5 rows per chunk in
// fp32 and 10 in bf16, the last chunk partial.
inline constexpr int64_t kParityMlpChunkBytes = 2300;

// One way of running the executor against the reference: compute dtype,
// micro-batches per pass, activation offload, resident layers and
// embedding, device gradient accumulation (resident embedding skipped for tied variants, whose
// embedding cannot be resident: ExecutorTest.RefusesBadOptionsNamingTheField checks the refusal).
struct ParityMode {
  std::string name;  // part of the test name, e.g. "Bf16WithActivationOffload"
  engine::ComputeDtype dtype = engine::ComputeDtype::kFp32;
  int micro_batches = 1;
  bool offload_activations = false;
  int resident_layers = 0;
  bool resident_embedding = false;
  bool device_grad_accumulation = false;
  engine::StepSchedule schedule = engine::StepSchedule::kMicroBatchMajor;
  int wave = 1;                 // layer-major micro-batches per wave
  int64_t mlp_chunk_bytes = 0;  // 0: the executor's default (no chunking at these sizes)
  bool cuda_graphs = false;     // Note [Layer graphs] (the CPU runtime re-runs the bodies)
  bool fused_kernels = false;   // ExecutorOptions::fused_kernels (Note [Fused kernels])
  int kept_graph_layers = 0;    // ExecutorOptions::kept_graph_layers (Note [Kept layer graphs])
};

// The modes both parity suites run: plain fp32 and bf16 with
// `plain_micro_batches` micro-batches per pass; two with activation offload
// (the host slots and the device ring are reused) and with resident layers
// (Note [Resident layers]: the gradient is also accumulated on the device;
// two resident layers of three in fp32, one in bf16); the embedding
// resident (Note [Resident embedding]: gather and scatter on the device;
// with one resident layer in fp32, alone in bf16); the micro-batches'
// gradients summed on the device (Note [Device gradient accumulation]; two
// in fp32, three with a resident layer in bf16); the MLP in chunks of rows
// (kParityMlpChunkBytes; with gradient accumulation, in bf16 also with
// activation offload); dense layers from CUDA graphs (Note [Layer graphs];
// fp32 alone, bf16 with a resident layer and device accumulation).
std::vector<ParityMode> ParityModes(int plain_micro_batches);

// The same kinds of modes under the layer-major schedule (Note [Layer-major
// schedule]): accumulation 1, 3 and 4, waves of all and of fewer
// micro-batches, activations on the device and offloaded, the MLP in
// chunks (kParityMlpChunkBytes), and dense layers from CUDA graphs.
std::vector<ParityMode> LayerMajorParityModes();

// bf16 modes of both schedules with ExecutorOptions::fused_kernels on
// (Note [Fused kernels] in engine/model/fused_math.h): plain, with the MLP
// in chunks and activation offload, with a resident layer and device
// accumulation, from CUDA graphs, and layer-major in one wave. Empty in a
// build without the kernels (engine::FusedKernelsCompiled()), where the
// executor refuses the option.
std::vector<ParityMode> FusedKernelParityModes();

// RunParity of `variant` on `device` in `mode` (micro-batches of [2, 12];
// weights init range 0.2 for fp32, 0.02 for bf16), then the loss and every
// gradient within the dtype's tolerance: fp32 1e-5 relative (only the
// summation order differs), bf16 2e-2 (8-bit mantissa matmuls on both
// sides, rounded at different points).
void ExpectParity(const Variant& variant, const std::string& device, const ParityMode& mode);

// Gradients (all blocks, concatenated) and loss of one ForwardBackward over
// `micro_batches` micro-batches of [b, t] on `device`, from weights seeded
// as in RunParity; `stats` receives the pass's statistics when non-null.
// Empty gradients when setup or the pass failed (a failure is recorded).
struct GradientRun {
  std::vector<float> grads;
  double loss = 0;
  engine::StepStats stats;
};
GradientRun RunGradients(const engine::ModelConfig& config, const std::string& device,
                         engine::ComputeDtype dtype, double init_range, int micro_batches,
                         int64_t b, int64_t t, bool offload_activations, int resident_layers = 0,
                         bool resident_embedding = false, bool device_grad_accumulation = false,
                         engine::StepSchedule schedule = engine::StepSchedule::kMicroBatchMajor,
                         int wave = 1, bool cuda_graphs = false, int kept_graph_layers = 0);

// Note [Document attention] (engine/model/layers.h): micro-batches of
// [b, t] whose rows pack several documents and carry position ids.
// `rows[r]` lists the lengths of row r's documents (each >= 2, summing to
// t); micro-batch m holds rows [m * b, (m + 1) * b). Tokens are drawn from
// `seed`; a document's labels are its next tokens, its last one ignored
// (as the data loader's isolated packing leaves them).
std::vector<engine::MicroBatch> MakePackedBatches(const std::vector<std::vector<int64_t>>& rows,
                                                  int64_t b, int64_t t, int64_t vocab,
                                                  uint32_t seed);

// Row layouts for micro-batches of [2, 12]: two micro-batches, documents
// shorter and longer than the variants' sliding windows (5 and 7), a row
// of one document and rows of two and three.
std::vector<std::vector<int64_t>> PackedParityRows();

// The executor on MakePackedBatches(rows, b, t) on `device` against the
// reference run on every document alone: one reference row of t tokens
// per document, the document first and filler after it with ignored
// labels ("as if run one by one, up to padding": causal attention never
// reads the filler, and RoPE tables and LongRoPE factors are those of
// length t on both sides). Errors as RunParity's.
ParityResult RunPackedDocumentParity(const engine::ModelConfig& config, const std::string& device,
                                     engine::ComputeDtype dtype, double init_range,
                                     const std::vector<std::vector<int64_t>>& rows, int64_t b,
                                     int64_t t);

// Gradients and loss of one ForwardBackward over `batches` ([b, t] each)
// on `device`, from weights seeded as in RunParity (RunGradients with given
// micro-batches).
GradientRun RunGradientsOn(const engine::ModelConfig& config, const std::string& device,
                           engine::ComputeDtype dtype, double init_range, int64_t b, int64_t t,
                           const std::vector<engine::MicroBatch>& batches);

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_PARITY_H_
