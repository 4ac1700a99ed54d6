// megatraind with the fake engine (fake_engine_backend.h): the real command
// line, signal handling and listeners (server/rpc/daemon_main.h) in a process of
// its own, for tests of what only a whole process shows (SIGHUP, exit codes,
// a second daemon on the same port) in builds without LibTorch. Never
// installed.
#include <memory>

#include "server/rpc/daemon_main.h"
#include "tests/server/fake_engine_backend.h"

int main(int argc, char** argv) {
  return megatrain::server::RunDaemonMain(
      argc, argv, [] { return std::make_unique<megatrain::server::testing::FakeEngineBackend>(); });
}
