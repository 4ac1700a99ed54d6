// A monolithic LibTorch autograd implementation of the Llama-family decoder,
// written independently of engine/model/layers.cc (explicit attention matrix, RoPE
// on split halves with frequencies in double precision, GQA by head index),
// used as the numerical reference for every engine path.
#ifndef MEGATRAIN_TESTS_TESTING_REFERENCE_LLAMA_H_
#define MEGATRAIN_TESTS_TESTING_REFERENCE_LLAMA_H_

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "engine/store/host_store.h"
#include "engine/model/model_config.h"

namespace megatrain::testing {

// Parameters by HF name, fp32 leaves with requires_grad.
using ReferenceParams = std::map<std::string, at::Tensor>;

// Copies the store's master weights into fresh fp32 leaves.
ReferenceParams ParamsFromStore(const engine::HostStore& store);

// Mean token cross-entropy over labels != -100 of input_ids [B, T] (int64)
// with labels [B, T] (int64, already shifted). With `bf16` the matmuls and
// attention run in bf16 on bf16 casts of the weights, as under torch.autocast
// (residual stream, norms and loss in fp32). Differentiable w.r.t. params.
at::Tensor ReferenceLoss(const engine::ModelConfig& config, const ReferenceParams& params,
                         const at::Tensor& input_ids, const at::Tensor& labels, bool bf16);

// Logits [B, T, V] fp32 of the same model (what ReferenceLoss scores).
at::Tensor ReferenceLogits(const engine::ModelConfig& config, const ReferenceParams& params,
                           const at::Tensor& input_ids, bool bf16);

// ||a - b|| / max(||b||, tiny): the norm-relative error used by the parity
// tests (an elementwise relative error is meaningless near zero).
double RelativeError(const at::Tensor& a, const at::Tensor& b);

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_REFERENCE_LLAMA_H_
