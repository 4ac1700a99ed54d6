// See rpc_priority.h.
#include "server/rpc/rpc_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace megatrain::server {
namespace {

std::atomic<int> rpc_nice{kDefaultRpcNice};
thread_local int applied_nice = -1;  // what this thread set, -1: nothing yet

}  // namespace

void SetRpcThreadNice(int nice) { rpc_nice.store(std::clamp(nice, 0, 19)); }

int RpcThreadNice() { return rpc_nice.load(); }

void LowerThisRpcThread() {
  const int nice = rpc_nice.load(std::memory_order_relaxed);
  if (applied_nice == nice) return;
  applied_nice = nice;
  // Linux: PRIO_PROCESS with a thread id sets that thread's nice value.
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, tid, nice);
}

}  // namespace megatrain::server
