// What the executor hands on when a block's gradient of a pass is final
// (StreamingExecutor::ForwardBackward's callback; Notes [Gradient landing]
// and [Gradient ring] in step/grad_lander.h).
#ifndef MEGATRAIN_ENGINE_STEP_FINAL_GRADIENT_H_
#define MEGATRAIN_ENGINE_STEP_FINAL_GRADIENT_H_

#include <cstdint>
#include <functional>

namespace megatrain::engine {

// A block's final gradient, or one piece of it. Without the gradient ring,
// for the embedding and for a block resident on the device: one call per
// block, begin 0 and count the block's elements, data its gradient in the
// host store (nullptr for a resident block, whose gradient stays on the
// device). With the ring (Note [Gradient ring]): one call per piece, in
// order, [begin, begin + count) of the block's elements at `data` (a
// pinned ring buffer, count fp32), the whole block in one piece when it
// fits a buffer.
struct FinalGradient {
  int64_t block = 0;
  // Squared L2 norm of the whole block's gradient (fp32 values summed in
  // fp64; computed on the device for blocks whose gradient came in one
  // contribution). The same in every piece of a block.
  double grad_squared_norm = 0;
  int64_t begin = 0;
  int64_t count = 0;
  const float* data = nullptr;
  bool first = true;  // the block's first call of the pass
  bool last = true;   // its last
  // Ring pieces only (else empty): the consumer calls it exactly once,
  // from any thread, after its last read of `data`; the buffer then takes
  // the next piece. A consumer that does not keep `data` calls it before
  // returning.
  std::function<void()> release;
};

// Called once per block (per piece with the ring) per ForwardBackward, on
// the executor's accumulator thread, in landing order.
using BlockFinalCallback = std::function<void(const FinalGradient&)>;

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_FINAL_GRADIENT_H_
