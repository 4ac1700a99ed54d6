// CUDA graphs of a decoder layer's forward and of its recompute and
// backward (Note [Layer graphs]).
//
// Note [Layer graphs]
// At small micro-batches a step is bound by the host, not the GPU: a
// decoder layer's forward is ~30 kernels and its recompute and backward
// ~90, each of a few tens of microseconds at 1 x 2048 tokens, and
// LibTorch's dispatch and autograd between two launches take about as
// long as the kernel (docs/performance-history.md, "2026-11-24 (CUDA-graphs)": 43% of a traced
// micro-batch-1 step is launch gaps, in both this engine and resident
// PyTorch). Captured once as a CUDA graph, the same kernels are replayed
// with one launch.
//
// What a graph is keyed by, and why it is correct:
//   * the work (forward, or recompute and backward), the weights' device
//     address (a weight slot or a resident layer: fixed for the executor's
//     life, the contents change and are read at replay), the layer's
//     variant (its attention type, and whether it scales the embedding:
//     the only ways decoder layers of one model differ), and the inputs'
//     shapes and dtypes. Everything else a layer reads (RoPE tables, the
//     sliding-window mask) is allocated once per executor.
//   * Inputs are copied into the graph's static input tensors before each
//     replay; outputs are the graph's static outputs, rewritten by the next
//     replay of the same graph. Callers read them on the compute stream
//     before that replay (stream order makes this safe) and clone what
//     they keep longer (a layer's output, the input gradient).
//   * Every graph keeps its static inputs and outputs alive, so the shared
//     memory pool never hands them to another graph; temporaries freed
//     inside a capture are shared between graphs, which are replayed one
//     at a time on the one compute stream.
//   * The first use of a key runs eagerly (warm-up: cuBLAS handles, cuDNN
//     plans, the allocator's blocks); the second captures and replays.
//   * A replay runs the captured kernels on the same addresses and shapes,
//     so results equal eager execution's kernel for kernel where the
//     kernels are deterministic; executor_parity_cuda_test compares them.
//   * A capture that fails (an op that synchronises with the host, or is
//     not capturable) turns graphs off for the executor, says so once on
//     stderr, and the layer runs eagerly: never a wrong result.
// Not used for mixture-of-experts layers (the router's token counts are
// data-dependent shapes).
//
// Ownership: owns the graphs and their static tensors (device memory:
// LayerGraphBytes in executor.h's plan bounds it). Thread-safety: the
// executor's enqueuing thread only. Streams: kCompute.
#ifndef MEGATRAIN_ENGINE_STEP_LAYER_GRAPHS_H_
#define MEGATRAIN_ENGINE_STEP_LAYER_GRAPHS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/model/model_config.h"
#include "engine/runtime/device_runtime.h"

namespace megatrain::engine {

// The variant of decoder layer `layer` of `config` as far as its captured
// work can differ from another layer's with the same weights address: its
// attention type, and whether it scales the embedding (layer 0 of Gemma).
int LayerGraphVariant(const ModelConfig& config, int64_t layer);

// How many graphs an executor may hold, and a bound of their device memory
// in bytes: a forward and a backward graph per weights address (each
// weight slot, for every variant, and each resident layer), each keeping
// its static inputs and outputs ([B, T, C] fp32 tensors, and the layer's
// gradient in the compute dtype), plus one layer's recompute and backward
// working set for the temporaries the graphs share. `tokens`: B x T;
// `compute_bytes`: 2 (bf16) or 4; `largest_layer_numel`: elements of the
// largest decoder layer. Pure.
int LayerGraphCount(const ModelConfig& config, int num_weight_slots, int resident_layers);
int64_t LayerGraphBytes(const ModelConfig& config, int num_weight_slots, int resident_layers,
                        int64_t tokens, int64_t compute_bytes, int64_t largest_layer_numel);

// The work a graph holds.
enum class LayerWork { kForward, kRecomputeBackward };

class LayerGraphs {
 public:
  // Tensors in, tensors out; reads only its arguments and memory that
  // outlives the graphs (weights, RoPE tables, masks).
  using Body = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

  // `enabled` false: Run always executes `body` eagerly. `max_graphs`
  // bounds the number of captured graphs (further keys run eagerly).
  LayerGraphs(DeviceRuntime* runtime, bool enabled, int max_graphs)
      : runtime_(runtime), enabled_(enabled), max_graphs_(max_graphs) {}

  // body(inputs) for the graph of (work, weights, variant, the inputs'
  // shapes and dtypes): eagerly on a key's first use, else by replaying its
  // graph (captured at the second use). The last `kept_last` outputs are
  // cloned when they come from a graph; the others are valid until the
  // next Run of the same key and must be read on the compute stream before
  // it. Enqueued on the current (compute) stream. Throws what
  // `body` throws when running eagerly.
  std::vector<at::Tensor> Run(LayerWork work, const void* weights, int variant,
                              const std::vector<at::Tensor>& inputs, size_t kept_last,
                              const Body& body);

  bool enabled() const { return enabled_; }
  // Graphs captured so far, and replays since construction.
  int64_t graphs() const { return graphs_; }
  int64_t replays() const { return replays_; }

 private:
  struct Entry {
    int uses = 0;
    std::vector<at::Tensor> inputs, outputs;  // static: the graph's addresses
    std::unique_ptr<DeviceGraph> graph;
  };
  static std::string Key(LayerWork work, const void* weights, int variant,
                         const std::vector<at::Tensor>& inputs);
  // Captures `e`'s graph; false (and graphs off) when capture fails.
  bool Capture(Entry& e, const std::vector<at::Tensor>& inputs, const Body& body);

  DeviceRuntime* runtime_;
  bool enabled_;
  int max_graphs_;
  int64_t graphs_ = 0;
  int64_t replays_ = 0;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> entries_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_LAYER_GRAPHS_H_
