// The first use of LibTorch's lazily filled, process-wide CUDA state by
// the ranks of a data-parallel trainer, made one rank at a time before
// their first step (Note [Serial first use]).
#ifndef MEGATRAIN_ENGINE_DIST_FIRST_USE_H_
#define MEGATRAIN_ENGINE_DIST_FIRST_USE_H_

#include "absl/status/status.h"
#include "engine/runtime/device_runtime.h"

namespace megatrain::engine {

// Note [Serial first use]
// The first GEMM that a thread runs on a device and stream fills caches
// that LibTorch keeps for the whole process: the cuBLAS and cuBLASLt
// workspaces, two std::maps keyed by (handle, stream) in
// ATen/cuda/CublasHandlePool.cpp. LibTorch wrote them without a lock until
// late 2025 (pytorch/pytorch#167928 added one); deploy/gpu-crash-hunt.sh
// prints whether the LibTorch it runs has it. A data-parallel step reaches
// that first use on every rank at once: each rank thread's forward, and
// autograd's device threads (one per GPU) that run each rank's backward,
// all leave the step's first collective together. Two insertions into one
// std::map at once corrupt its tree: a SIGSEGV in
// std::_Rb_tree_insert_and_rebalance, as one 4-GPU run in five hit (with
// a LibTorch that locks the maps, as the GPU hosts' most likely does, that
// crash had another cause: docs/distributed.md).
//
// DataParallelTrainer::Create therefore runs WarmUpFirstUse on every
// rank's own thread (RankThreads::RunOneAtATime), one rank after the
// other, on the stream its steps compute on, so that every later lookup
// of those maps finds its entry and writes nothing. The warm-up touches
// only what the first step would: one workspace per map for the rank
// thread and one for autograd's thread, on the compute stream.
//
// The same holds for attention: LibTorch 2.11 on sm90 with its bundled
// cuDNN (>= 9.15) takes cuDNN's attention for SDPA by default, and every
// rank thread (forward) and autograd thread (backward) builds its first
// cuDNN graphs at once, inside libcudnn's process-wide state (cuDNN
// promises thread safety across handles; its frontend's KernelCache, for
// one, was not, until NVIDIA/cudnn-frontend#815). The warm-up therefore
// also runs one causal attention, forward and backward, with the model's
// head_dim: cuDNN's (or flash's) process-wide first use happens one rank
// at a time; the step's own shapes still build their graphs concurrently
// (each thread keeps its own cache of them).
//
// It does not cover a first use outside a trainer's rank threads: two
// jobs of one daemon starting at once still meet the maps together (each
// warm-up holds a process-wide lock, but a single-device job does not
// warm up). With a LibTorch that locks the maps, none of this is needed
// and it costs a few small GEMMs per rank.

// On the calling thread, with `runtime`'s compute stream current: fp32 and
// (on CUDA) bf16 GEMMs through cuBLAS (a matrix product) and cuBLASLt (a
// linear layer with a bias), and, for `head_dim` > 0, a causal attention
// of 2 heads x 128 tokens x head_dim (bf16 on CUDA, fp32 on the CPU),
// each forward on this thread and backward on autograd's thread for the
// device; then waits for the device. Holds a process-wide lock
// throughout, so that two warm-ups never overlap. Errors:
// RESOURCE_EXHAUSTED when the device is out of memory, INTERNAL for any
// other LibTorch error (naming the device).
absl::Status WarmUpFirstUse(DeviceRuntime& runtime, int64_t head_dim);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DIST_FIRST_USE_H_
