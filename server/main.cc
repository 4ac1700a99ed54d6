// megatraind: the MegaTrain training daemon. See server/rpc/daemon_main.h for
// the flags and server/rpc/daemon.h for what it serves.
#include "server/rpc/daemon_main.h"
#include "server/core/engine_backend.h"

int main(int argc, char** argv) {
  return megatrain::server::RunDaemonMain(argc, argv, megatrain::server::NewEngineBackend);
}
