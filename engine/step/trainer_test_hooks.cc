// Fault injection through the Trainer's test hooks (trainer_test_hooks.h).
#include "engine/step/trainer_test_hooks.h"

#include <limits>

#include "engine/optim/adamw.h"
#include "engine/store/host_store.h"
#include "engine/step/trainer.h"

namespace megatrain::engine {
namespace {

class NonFiniteInjector : public TrainerTestHooks {
 public:
  NonFiniteInjector(const NonFiniteInjection& injection, HostStore* store, ThreadPool* pool)
      : injection_(injection), store_(store), pool_(pool) {}

  void BeginStep(int64_t step) override {
    // First attempt only: the injection fires once.
    active_ = injection_.step == step && !fired_;
    if (active_) fired_ = true;
  }

  double BlockFinal(int64_t block, float* host_grad, double grad_sq) override {
    const bool loss = injection_.kind == NonFiniteInjection::Kind::kLoss;
    // kLoss poisons every block (as a NaN in forward does); kGradient the
    // embedding, whose gradient is final last.
    if (!active_ || (!loss && block != store_->layout().embedding_block())) return grad_sq;
    if (host_grad == nullptr) {
      return loss ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
    }
    host_grad[0] =
        loss ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    return SumOfSquares(host_grad, store_->block_numel(block), pool_);
  }

  double Loss(double loss) override {
    const bool poison = active_ && injection_.kind == NonFiniteInjection::Kind::kLoss;
    return poison ? std::numeric_limits<double>::quiet_NaN() : loss;
  }

 private:
  const NonFiniteInjection injection_;
  HostStore* store_;
  ThreadPool* pool_;
  bool active_ = false;  // the current step is poisoned
  bool fired_ = false;
};

}  // namespace

std::unique_ptr<TrainerTestHooks> MakeNonFiniteInjector(const NonFiniteInjection& injection,
                                                        HostStore* store, ThreadPool* pool) {
  if (injection.step == 0) return nullptr;
  return std::make_unique<NonFiniteInjector>(injection, store, pool);
}

}  // namespace megatrain::engine
