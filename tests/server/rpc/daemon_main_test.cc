// megatraind as a process (tests/server/fake_megatraind.cc: the real
// RunDaemonMain over the fake engine): SIGHUP is logged and survived,
// --metrics_listen= turns /metrics off, a second daemon on the same gRPC
// address exits 1 naming the address, and SIGTERM still drains and exits 0.
// Every wait is bounded (poll on the daemon's stdout, waitpid with a
// deadline); everything listens on 127.0.0.1 only.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "server/rpc/daemon.h"
#include "tests/testing/temp_dir.h"

extern char** environ;

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;

// Far above what starting or stopping the fake daemon takes.
constexpr absl::Duration kTimeout = absl::Seconds(30);

// One fake megatraind process; killed (SIGKILL) by the destructor if still
// running.
class DaemonProcess {
 public:
  // Starts it with `args` (after the binary), stdout to a pipe and stderr
  // to `log_path`.
  DaemonProcess(const std::vector<std::string>& args, const std::string& log_path) {
    int out[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    stdout_fd_ = out[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<std::string> argv_strings = {MEGATRAIN_FAKE_MEGATRAIND};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
  }
  ~DaemonProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(stdout_fd_);
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // The first stdout line ("megatraind: ready grpc=... metrics=..."); empty
  // when the process closed stdout (exited) or kTimeout passed.
  std::string ReadyLine() {
    std::string line;
    const absl::Time deadline = absl::Now() + kTimeout;
    while (absl::Now() < deadline) {
      pollfd fd{stdout_fd_, POLLIN, 0};
      if (::poll(&fd, 1, 100) <= 0) continue;
      char c;
      if (::read(stdout_fd_, &c, 1) != 1) return "";
      if (c == '\n') return line;
      line.push_back(c);
    }
    return "";
  }

  // Sends `signal`.
  void Signal(int signal) { ::kill(pid_, signal); }

  // The exit status, waiting at most kTimeout; -1 when it did not exit.
  int Wait() {
    const absl::Time deadline = absl::Now() + kTimeout;
    while (absl::Now() < deadline) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));  // polling a child's exit: no event to wait on
    }
    return -1;
  }

  // True while the process has not exited.
  bool Running() {
    int status = 0;
    return ::waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool exited_ = false;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The gRPC address of a ready line.
std::string GrpcAddress(const std::string& ready_line) {
  const size_t start = ready_line.find("grpc=");
  if (start == std::string::npos) return "";
  const size_t end = ready_line.find(' ', start);
  return ready_line.substr(start + 5, end - start - 5);
}

// GetServerStatus answers.
void ExpectServing(const std::string& address) {
  client::ConnectionOptions options;
  options.server = address;
  auto connection = client::Connection::Create(options);
  ASSERT_TRUE(connection.ok());
  v1::ServerStatus status;
  grpc::Status rpc = (*connection)
                         ->server()
                         .GetServerStatus((*connection)->NewContext(kTimeout).get(), {}, &status);
  EXPECT_TRUE(rpc.ok()) << rpc.error_message();
}

std::vector<std::string> Flags(const std::string& state_dir, const std::string& listen,
                               const std::string& metrics_listen) {
  return {"--listen=" + listen, "--metrics_listen=" + metrics_listen, "--state_dir=" + state_dir,
          "--device=cpu",       "--measure_link_bandwidth=false",     "--shutdown_timeout=20"};
}

TEST(DaemonMainTest, SighupIsLoggedAndSurvivedAndEmptyMetricsListenTurnsMetricsOff) {
  const std::string dir = ::megatrain::testing::MakeTempDir();
  const std::string log = dir + "/daemon.log";
  DaemonProcess daemon(Flags(dir + "/state", "127.0.0.1:0", ""), log);
  const std::string ready = daemon.ReadyLine();
  ASSERT_THAT(ready, HasSubstr("megatraind: ready grpc=127.0.0.1:")) << ReadFile(log);
  EXPECT_THAT(ready, HasSubstr("metrics=off"));
  daemon.Signal(SIGHUP);
  daemon.Signal(SIGHUP);
  // A call after the signals is answered: the daemon is alive and serving.
  ExpectServing(GrpcAddress(ready));
  EXPECT_TRUE(daemon.Running());
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_THAT(text, HasSubstr("received SIGHUP: ignored (megatraind reloads nothing"));
  EXPECT_THAT(text, HasSubstr("received SIGTERM"));
}

// --version prints CMake's PROJECT_VERSION (passed to this test on its
// own), the version the daemon reports everywhere (daemon.h kVersion).
TEST(DaemonMainTest, VersionIsTheProjectVersion) {
  const std::string dir = ::megatrain::testing::MakeTempDir();
  DaemonProcess daemon({"--version"}, dir + "/daemon.log");
  EXPECT_EQ(daemon.ReadyLine(), std::string("megatraind ") + MEGATRAIN_PROJECT_VERSION);
  EXPECT_EQ(daemon.Wait(), 0);
  EXPECT_STREQ(kVersion, MEGATRAIN_PROJECT_VERSION);
}

TEST(DaemonMainTest, SecondDaemonOnTheSameAddressExitsOneNamingIt) {
  const std::string dir = ::megatrain::testing::MakeTempDir();
  DaemonProcess first(Flags(dir + "/first", "127.0.0.1:0", ""), dir + "/first.log");
  const std::string ready = first.ReadyLine();
  const std::string address = GrpcAddress(ready);
  ASSERT_THAT(address, HasSubstr("127.0.0.1:")) << ReadFile(dir + "/first.log");
  DaemonProcess second(Flags(dir + "/second", address, ""), dir + "/second.log");
  EXPECT_EQ(second.ReadyLine(), "");
  EXPECT_EQ(second.Wait(), 1);
  EXPECT_THAT(ReadFile(dir + "/second.log"),
              HasSubstr("--listen: cannot bind " + address + ": the address is in use"));
  ExpectServing(address);
  first.Signal(SIGTERM);
  EXPECT_EQ(first.Wait(), 0);
}

}  // namespace
}  // namespace megatrain::server
