// megatraind: the MegaTrain training daemon. See server/daemon_main.h for
// the flags and server/daemon.h for what it serves.
#include "server/daemon_main.h"
#include "server/engine_backend.h"

int main(int argc, char** argv) {
  return megatrain::server::RunDaemonMain(argc, argv, megatrain::server::NewEngineBackend);
}
