// NanPolicy lives in the job-spec library (engine/spec/nan_policy.h); this
// header keeps the optimizer-side include path of the trainer working.
#ifndef MEGATRAIN_ENGINE_NAN_POLICY_H_
#define MEGATRAIN_ENGINE_NAN_POLICY_H_

#include "engine/spec/nan_policy.h"

#endif  // MEGATRAIN_ENGINE_NAN_POLICY_H_
