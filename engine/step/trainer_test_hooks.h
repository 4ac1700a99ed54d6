// Test hooks of the Trainer: fault injection (and anything else a test
// needs to see or change inside a step) goes through this interface, not
// through branches in the step's hot path. A Trainer without hooks (the
// production case) calls none of them.
#ifndef MEGATRAIN_ENGINE_TRAINER_TEST_HOOKS_H_
#define MEGATRAIN_ENGINE_TRAINER_TEST_HOOKS_H_

#include <cstdint>
#include <memory>

namespace megatrain::engine {

class HostStore;
class ThreadPool;
struct NonFiniteInjection;

// Thread-safety: BeginStep and Loss on the step thread; BlockFinal on the
// executor's accumulator thread, between them. Implementations keep
// their state for these two threads only.
class TrainerTestHooks {
 public:
  virtual ~TrainerTestHooks() = default;
  // Step number `step` (from 1) begins.
  virtual void BeginStep(int64_t step) = 0;
  // `block`'s gradient is final with squared norm `grad_sq`; `host_grad`:
  // the whole gradient in host memory (block_numel fp32: the store's, or
  // a gradient ring buffer), nullptr when it is not (a resident block's
  // stays on the device; a block larger than a ring buffer comes in
  // pieces, Note [Gradient ring] in grad_lander.h). Returns the squared
  // norm the step uses; may rewrite `host_grad`.
  virtual double BlockFinal(int64_t block, float* host_grad, double grad_sq) = 0;
  // Returns the loss the step reports (after ForwardBackward).
  virtual double Loss(double loss) = 0;
};

// Hooks that make step `injection.step` non-finite once (Note
// [Non-finite steps] in trainer.h), as TrainerOptions::debug_nonfinite
// asks; null when `injection.step` is 0. `store` and `pool` (for the
// norm of a poisoned gradient) outlive the hooks.
std::unique_ptr<TrainerTestHooks> MakeNonFiniteInjector(const NonFiniteInjection& injection,
                                                        HostStore* store, ThreadPool* pool);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TRAINER_TEST_HOOKS_H_
