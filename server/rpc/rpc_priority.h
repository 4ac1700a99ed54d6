// The scheduling priority of the threads that serve RPCs.
//
// Note [RPC threads below training]
// megatraind serves the control plane (gRPC) and trains in one process. On
// a small machine a burst of clients (32 polling over loopback on 2 cores)
// took the cores from the job the daemon exists to run. So every thread
// that runs an RPC handler lowers its own priority the first time it does
// (setpriority(PRIO_PROCESS, tid): on Linux the nice value is per thread)
// to --rpc_nice (default kDefaultRpcNice): the kernel then gives the
// training threads (nice 0) their share first and the handlers what is
// left, while an idle machine still answers at once. Raising one's own
// nice value needs no privilege; the training threads are not touched.
// Combined with the bounded handler pool (--max_threads, a
// grpc::ResourceQuota) and progress written off the step (Note [Progress
// off the step] in server/core/serial_worker.h).
//
// Thread-safety: SetRpcThreadNice before the server starts;
// LowerThisRpcThread from any handler thread.
#ifndef MEGATRAIN_SERVER_RPC_PRIORITY_H_
#define MEGATRAIN_SERVER_RPC_PRIORITY_H_

namespace megatrain::server {

// Nice value of RPC threads unless --rpc_nice says otherwise: the lowest
// priority short of SCHED_IDLE (a nice-19 thread weighs 15 against a nice-0
// thread's 1024 in CFS, so it cannot take more than ~1.5% of a core from
// one training thread while the trainer wants it).
inline constexpr int kDefaultRpcNice = 19;

// The nice value RPC threads take, in [0, 19]; 0 leaves them alone.
void SetRpcThreadNice(int nice);
int RpcThreadNice();

// Applies RpcThreadNice() to the calling thread, once per thread (later
// calls return at once). A failure is ignored: priority is a preference.
void LowerThisRpcThread();

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_RPC_PRIORITY_H_
