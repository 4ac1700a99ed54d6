// CUDA graphs of decoder layers (Note [Layer graphs] in layer_graphs.h).
#include "engine/step/layer_graphs.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/step/working_bytes.h"

namespace megatrain::engine {

int LayerGraphVariant(const ModelConfig& config, int64_t layer) {
  return static_cast<int>(config.AttentionType(layer)) * 2 +
         (config.scale_embeddings && layer == 0 ? 1 : 0);
}

int LayerGraphCount(const ModelConfig& config, int num_weight_slots, int resident_layers) {
  absl::flat_hash_set<int> variants;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    variants.insert(LayerGraphVariant(config, l));
  }
  return 2 * (num_weight_slots * static_cast<int>(variants.size()) + resident_layers);
}

int64_t LayerGraphBytes(const ModelConfig& config, int num_weight_slots, int resident_layers,
                        int64_t tokens, int64_t compute_bytes, int64_t largest_layer_numel) {
  const int64_t hidden = tokens * config.hidden_size * 4;  // one [B, T, C] fp32
  // Forward: x in, y out. Backward: x and dy in; the layer's gradient and dx out.
  const int64_t pair = 2 * hidden + 3 * hidden + largest_layer_numel * compute_bytes;
  return LayerGraphCount(config, num_weight_slots, resident_layers) / 2 * pair +
         LayerActivationBytes(config, tokens, compute_bytes);
}

std::string LayerGraphs::Key(LayerWork work, const void* weights, int variant,
                             const std::vector<at::Tensor>& inputs) {
  std::string key =
      absl::StrCat(static_cast<int>(work), ":", reinterpret_cast<uintptr_t>(weights), ":", variant);
  for (const at::Tensor& t : inputs) {
    absl::StrAppend(&key, "|", static_cast<int>(t.scalar_type()));
    for (const int64_t d : t.sizes()) absl::StrAppend(&key, ",", d);
  }
  return key;
}

bool LayerGraphs::Capture(Entry& e, const std::vector<at::Tensor>& inputs, const Body& body) {
  e.inputs.clear();
  for (const at::Tensor& t : inputs) e.inputs.push_back(t.clone());
  Entry* entry = &e;
  try {
    e.graph = runtime_->CaptureGraph([entry, body] { entry->outputs = body(entry->inputs); });
  } catch (const std::exception& ex) {
    std::fprintf(stderr,
                 "megatrain: CUDA graph capture of a decoder layer failed (%s); layers run "
                 "without graphs from now on\n",
                 ex.what());
    enabled_ = false;
    e = Entry();
    return false;
  }
  ++graphs_;
  return true;
}

std::vector<at::Tensor> LayerGraphs::Run(LayerWork work, const void* weights, int variant,
                                         const std::vector<at::Tensor>& inputs, size_t kept_last,
                                         const Body& body) {
  if (!enabled_) return body(inputs);
  const std::string key = Key(work, weights, variant, inputs);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (static_cast<int64_t>(entries_.size()) >= max_graphs_) return body(inputs);
    it = entries_.emplace(key, std::make_unique<Entry>()).first;
  }
  Entry& e = *it->second;
  if (e.uses++ == 0) return body(inputs);  // warm-up
  if (e.graph == nullptr) {
    if (!Capture(e, inputs, body)) return body(inputs);
  } else {
    for (size_t i = 0; i < inputs.size(); ++i) e.inputs[i].copy_(inputs[i]);
  }
  e.graph->Replay();
  ++replays_;
  std::vector<at::Tensor> out = e.outputs;
  for (size_t i = out.size() - std::min(kept_last, out.size()); i < out.size(); ++i) {
    out[i] = out[i].clone();
  }
  return out;
}

}  // namespace megatrain::engine
