// Tests of server/core/metrics.h and server/core/metrics_http.h: family names follow
// the Prometheus conventions, engine stats land in the right families, and
// /metrics serves the text format over HTTP.
#include "server/core/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/metrics_http.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::Not;

engine::StepReport Step(int64_t tokens) {
  engine::StepReport report;
  report.step = 1;
  report.loss = 3.25;
  report.mfu = 0.4;
  report.tokens_per_s = 5000;
  report.stats.tokens = tokens;
  report.stats.step_seconds = 0.5;
  report.stats.h2d_seconds = 0.25;
  report.stats.compute_seconds = 0.4;
  report.stats.d2h_seconds = 0.1;
  report.stats.optimizer_seconds = 0.2;
  report.stats.gpu_idle_seconds = 0.1;
  report.stats.h2d_bytes = 1000;
  report.stats.d2h_bytes = 500;
  return report;
}

// megatrain_build_info carries CMake's PROJECT_VERSION (passed to this
// test on its own), as megatraind --version does.
TEST(MetricsTest, BuildInfoCarriesTheProjectVersion) {
  ServerMetrics metrics;
  EXPECT_THAT(metrics.TextExposition(), HasSubstr(std::string("megatrain_build_info{version=\"") +
                                                  MEGATRAIN_PROJECT_VERSION + "\"} 1"));
}

TEST(MetricsTest, EveryFamilyFollowsTheNamingConventions) {
  ServerMetrics metrics;
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    EXPECT_TRUE(absl::StartsWith(family.name, "megatrain_")) << family.name;
    if (family.type == prometheus::MetricType::Counter) {
      EXPECT_TRUE(absl::EndsWith(family.name, "_total")) << family.name;
    } else {
      EXPECT_FALSE(absl::EndsWith(family.name, "_total")) << family.name;
    }
    EXPECT_FALSE(family.help.empty()) << family.name;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        // Only bounded labels: never a job id or user.
        EXPECT_THAT(label.name, ::testing::AnyOf("phase", "direction", "device", "kind", "state",
                                                 "method", "code", "version"))
            << family.name;
      }
    }
  }
}

TEST(MetricsTest, StepStatsFeedCountersAndGauges) {
  ServerMetrics metrics;
  metrics.SetLinkBandwidth("cuda:0", {4000, 2000});
  metrics.RecordStep("cuda:0", Step(1024));
  metrics.RecordStep("cuda:0", Step(1024));
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_tokens_total 2048"));
  EXPECT_THAT(text, HasSubstr("megatrain_steps_total 2"));
  EXPECT_THAT(text, HasSubstr("megatrain_step_duration_seconds_count 2"));
  EXPECT_THAT(text, HasSubstr("megatrain_phase_seconds_total{phase=\"h2d\"} 0.5"));
  EXPECT_THAT(text, HasSubstr("megatrain_pcie_bytes_total{direction=\"h2d\"} 2000"));
  EXPECT_THAT(text, HasSubstr("megatrain_pcie_bytes_total{direction=\"d2h\"} 1000"));
  // 1000 bytes in 0.25 busy seconds.
  EXPECT_THAT(
      text,
      HasSubstr(
          "megatrain_pcie_bandwidth_bytes_per_second{device=\"cuda:0\",direction=\"h2d\"} 4000"));
  // 1000 bytes / (0.5 s x 4000 B/s) = 0.5 of the link.
  EXPECT_THAT(
      text, HasSubstr("megatrain_pcie_utilization_ratio{device=\"cuda:0\",direction=\"h2d\"} 0.5"));
  EXPECT_THAT(text, HasSubstr("megatrain_mfu_ratio{device=\"cuda:0\"} 0.4"));
  EXPECT_THAT(text, HasSubstr("megatrain_training_loss{device=\"cuda:0\"} 3.25"));
}

// Note [Per-job series]: a running job's loss, eval loss, learning rate,
// gradient norm and tokens/s under its id; removed when it stops running.
TEST(MetricsTest, PerJobSeriesCarryTheJobIdAndAreRemovedWhenItEnds) {
  ServerMetrics metrics;
  engine::StepReport report = Step(1024);
  report.lr = 0.001;
  report.grad_norm = 1.5;
  metrics.RecordJobStep("job-000001", report);
  metrics.RecordJobEval("job-000001", 2.5);
  report.loss = 4.0;
  metrics.RecordJobStep("job-000002", report);

  std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_job_loss{job_id=\"job-000001\"} 3.25"));
  EXPECT_THAT(text, HasSubstr("megatrain_job_loss{job_id=\"job-000002\"} 4"));
  EXPECT_THAT(text, HasSubstr("megatrain_job_eval_loss{job_id=\"job-000001\"} 2.5"));
  EXPECT_THAT(text, HasSubstr("megatrain_job_learning_rate{job_id=\"job-000001\"} 0.001"));
  EXPECT_THAT(text, HasSubstr("megatrain_job_grad_norm{job_id=\"job-000001\"} 1.5"));
  EXPECT_THAT(text, HasSubstr("megatrain_job_step_tokens_per_second{job_id=\"job-000001\"} 5000"));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_job_eval_loss{job_id=\"job-000002\"}")));

  metrics.RemoveJob("job-000001");

  text = metrics.TextExposition();
  EXPECT_THAT(text, Not(HasSubstr("job-000001")));
  EXPECT_THAT(text, HasSubstr("megatrain_job_loss{job_id=\"job-000002\"} 4"));
}

TEST(MetricsTest, SkippedStepKeepsTheJobsLastLoss) {
  ServerMetrics metrics;
  metrics.RecordJobStep("job-000001", Step(1024));
  engine::StepReport skipped = Step(1024);
  skipped.skipped = true;
  skipped.loss = std::numeric_limits<double>::quiet_NaN();

  metrics.RecordJobStep("job-000001", skipped);

  EXPECT_THAT(metrics.TextExposition(),
              HasSubstr("megatrain_job_loss{job_id=\"job-000001\"} 3.25"));
}

TEST(MetricsTest, EvalLossOfADeviceIsRemovedWhenItsJobEnds) {
  ServerMetrics metrics;
  metrics.RecordEval("cuda:0", 2.5);
  ASSERT_THAT(metrics.TextExposition(), HasSubstr("megatrain_eval_loss{device=\"cuda:0\"} 2.5"));

  metrics.ClearDevice("cuda:0");

  EXPECT_THAT(metrics.TextExposition(), Not(HasSubstr("megatrain_eval_loss{device=")));
}

// Note [Per-device metrics]: with each device's stats, each GPU's PCIe
// bandwidth under its own label and the bytes of both in the total.
TEST(MetricsTest, DataParallelStepGivesEachDeviceItsOwnPcieSeries) {
  ServerMetrics metrics;
  engine::StepReport report = Step(2048);
  report.devices = 2;
  engine::StepStats second = report.stats;
  second.h2d_bytes = 3000;
  second.h2d_seconds = 0.5;
  report.device_stats = {report.stats, second};
  metrics.RecordStep(std::vector<std::string>{"cuda:2", "cuda:3"}, report);
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_pcie_bytes_total{direction=\"h2d\"} 4000"));
  EXPECT_THAT(text,
              HasSubstr("megatrain_pcie_bandwidth_bytes_per_second{device=\"cuda:2\",direction="
                        "\"h2d\"} 4000"));
  EXPECT_THAT(text,
              HasSubstr("megatrain_pcie_bandwidth_bytes_per_second{device=\"cuda:3\",direction="
                        "\"h2d\"} 6000"));
}

// Note [Per-device metrics]: a 2-device job's step gives each device its
// tokens/s and MFU, the job's total under its first device, and counts the
// global batch's tokens once.
TEST(MetricsTest, DataParallelStepGivesTokensPerSecondPerDeviceAndInTotal) {
  ServerMetrics metrics;
  engine::StepReport report = Step(2048);
  report.devices = 2;
  report.tokens_per_s = 5000;
  report.device_tokens_per_s = 2500;
  metrics.RecordStep(std::vector<std::string>{"cuda:2", "cuda:3"}, report);
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_tokens_per_second{device=\"cuda:2\"} 2500"));
  EXPECT_THAT(text, HasSubstr("megatrain_tokens_per_second{device=\"cuda:3\"} 2500"));
  EXPECT_THAT(text, HasSubstr("megatrain_job_tokens_per_second{device=\"cuda:2\"} 5000"));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_job_tokens_per_second{device=\"cuda:3\"}")));
  EXPECT_THAT(text, HasSubstr("megatrain_mfu_ratio{device=\"cuda:3\"} 0.4"));
  EXPECT_THAT(text, HasSubstr("megatrain_tokens_total 2048"));
  EXPECT_THAT(text, HasSubstr("megatrain_steps_total 1"));
  // Without per-device stats: rank 0's copies, under the first device only.
  EXPECT_THAT(text, HasSubstr("megatrain_pcie_bytes_total{direction=\"h2d\"} 1000"));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_pcie_bandwidth_bytes_per_second{device=\"cuda:3\"")));
  // One device: its tokens/s is the job's.
  metrics.RecordStep("cuda:0", Step(1024));
  const std::string one = metrics.TextExposition();
  EXPECT_THAT(one, HasSubstr("megatrain_tokens_per_second{device=\"cuda:0\"} 5000"));
  EXPECT_THAT(one, HasSubstr("megatrain_job_tokens_per_second{device=\"cuda:0\"} 5000"));
  metrics.ClearDevice("cuda:2");
  metrics.ClearDevice("cuda:3");
  const std::string cleared = metrics.TextExposition();
  EXPECT_THAT(cleared, HasSubstr("megatrain_tokens_per_second{device=\"cuda:3\"} 0"));
  EXPECT_THAT(cleared, HasSubstr("megatrain_job_tokens_per_second{device=\"cuda:2\"} 0"));
}

TEST(MetricsTest, StepsAddLinkBytesByTheDevicesLinkModel) {
  ServerMetrics metrics;
  // cuda:0 keeps the defaults until a model is set; cuda:1 has a measured one.
  metrics.RecordStep("cuda:0", Step(1024));  // 1000 B H2D, 500 B D2H
  PcieLinkModel measured;
  measured.rx_per_h2d_byte = 1.5;
  measured.tx_per_h2d_byte = 0.25;
  measured.tx_per_d2h_byte = 1.25;
  measured.rx_per_d2h_byte = 0;
  measured.calibrated = true;
  metrics.SetPcieLinkModel("cuda:1", measured);
  metrics.RecordStep("cuda:1", Step(1024));
  metrics.RecordStep("cuda:1", Step(1024));
  engine::StepReport cpu_step = Step(1024);
  cpu_step.stats.h2d_bytes = 0;
  cpu_step.stats.d2h_bytes = 0;
  metrics.RecordStep("cpu", cpu_step);  // no copies: no series
  const std::string text = metrics.TextExposition();
  // Defaults: rx 1.078 x 1000; tx 1.094 x 500 + 0.094 x 1000.
  EXPECT_THAT(
      text,
      HasSubstr(
          "megatrain_pcie_link_estimate_bytes_total{device=\"cuda:0\",direction=\"rx\"} 1078"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "megatrain_pcie_link_estimate_bytes_total{device=\"cuda:0\",direction=\"tx\"} 641"));
  // Two steps: rx 2 x 1.5 x 1000; tx 2 x (1.25 x 500 + 0.25 x 1000).
  EXPECT_THAT(
      text,
      HasSubstr(
          "megatrain_pcie_link_estimate_bytes_total{device=\"cuda:1\",direction=\"rx\"} 3000"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "megatrain_pcie_link_estimate_bytes_total{device=\"cuda:1\",direction=\"tx\"} 1750"));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_pcie_link_estimate_bytes_total{device=\"cpu\"")));
  EXPECT_THAT(
      text,
      HasSubstr(
          "megatrain_pcie_link_model_ratio{device=\"cuda:1\",kind=\"tx_per_d2h_byte\"} 1.25"));
  EXPECT_THAT(text, HasSubstr("megatrain_pcie_link_model_calibrated{device=\"cuda:1\"} 1"));
}

TEST(MetricsTest, HostStoreSumsRunningJobsAndClearsOnEnd) {
  ServerMetrics metrics;
  engine::HostStoreBytes bytes;
  bytes.master = 100;
  bytes.grad = 100;
  bytes.pinned = 30;
  metrics.SetHostStore("cuda:0", bytes);
  metrics.SetHostStore("cuda:1", bytes);
  std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_host_store_bytes{kind=\"master\"} 200"));
  EXPECT_THAT(text, HasSubstr("megatrain_host_pinned_bytes 60"));
  metrics.ClearDevice("cuda:1");
  text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_host_store_bytes{kind=\"master\"} 100"));
}

TEST(MetricsTest, JobCountsAndRpcs) {
  ServerMetrics metrics;
  metrics.SetJobCounts({{JobState::kQueued, 3}, {JobState::kRunning, 1}});
  metrics.SetHostMemory(1000, 250);
  metrics.RecordRpc("SubmitJob", absl::StatusCode::kOk, 0.01);
  metrics.RecordRpc("SubmitJob", absl::StatusCode::kInvalidArgument, 0.01);
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_jobs{state=\"queued\"} 3"));
  EXPECT_THAT(text, HasSubstr("megatrain_queue_depth 3"));
  EXPECT_THAT(text, HasSubstr("megatrain_host_memory_budget_bytes 1000"));
  EXPECT_THAT(text, HasSubstr("megatrain_host_memory_reserved_bytes 250"));
  EXPECT_THAT(text,
              HasSubstr("megatrain_rpcs_total{code=\"INVALID_ARGUMENT\",method=\"SubmitJob\"} 1"));
  EXPECT_THAT(text, HasSubstr("megatrain_rpc_duration_seconds_count{method=\"SubmitJob\"} 2"));
}

TEST(MetricsTest, NvmlPcieBytesAdvanceByTheGrowthOfTheTotals) {
  ServerMetrics metrics;
  metrics.SetNvmlPcieBytes("cuda:0", 1000, 3000, 0);
  metrics.SetNvmlPcieBytes("cuda:0", 1500, 3000, 2);
  metrics.SetNvmlPcieBytes("cuda:0", 1400, 2000, 1);  // lower totals never lower a counter
  metrics.SetNvmlPcieBytes("cuda:1", 7, 8, 0);
  const std::string text = metrics.TextExposition();
  EXPECT_THAT(
      text, HasSubstr("megatrain_nvml_pcie_bytes_total{device=\"cuda:0\",direction=\"tx\"} 1500"));
  EXPECT_THAT(
      text, HasSubstr("megatrain_nvml_pcie_bytes_total{device=\"cuda:0\",direction=\"rx\"} 3000"));
  EXPECT_THAT(text,
              HasSubstr("megatrain_nvml_pcie_bytes_total{device=\"cuda:1\",direction=\"rx\"} 8"));
  EXPECT_THAT(text, HasSubstr("megatrain_nvml_pcie_counter_late_reads_total{device=\"cuda:0\"} 2"));
  EXPECT_THAT(text, HasSubstr("megatrain_nvml_pcie_counter_late_reads_total{device=\"cuda:1\"} 0"));
  EXPECT_THAT(text, HasSubstr("# TYPE megatrain_nvml_pcie_bytes_total counter"));
}

TEST(MetricsTest, PreCollectHookRunsOnEveryScrape) {
  ServerMetrics metrics;
  int calls = 0;
  metrics.SetPreCollectHook([&] {
    ++calls;
    metrics.SetGpuMemory("cuda:0", 10, 80);
  });
  EXPECT_THAT(metrics.TextExposition(),
              HasSubstr("megatrain_gpu_memory_used_bytes{device=\"cuda:0\"} 10"));
  metrics.Collect();
  EXPECT_EQ(calls, 2);
}

TEST(MetricsHttpTest, ServesMetricsText) {
  ServerMetrics metrics;
  metrics.RecordStep("cpu", Step(77));
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_THAT(server, IsOk());
  ASSERT_GT((*server)->port(), 0);
  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Result result = client.Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_THAT(result->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(result->body, HasSubstr("megatrain_tokens_total 77"));
  (*server)->Stop();
}

TEST(MetricsHttpTest, BusyPortIsUnavailable) {
  ServerMetrics metrics;
  auto first = MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_THAT(first, IsOk());
  auto second = MetricsHttpServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), &metrics);
  EXPECT_THAT(second, ::megatrain::testing::StatusIs(absl::StatusCode::kUnavailable,
                                                     HasSubstr("--metrics_listen")));
}

// A TCP connection to 127.0.0.1:`port` (closed by the destructor); -1 when
// connect fails (a test failure).
class LoopbackSocket {
 public:
  explicit LoopbackSocket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ADD_FAILURE() << "connect 127.0.0.1:" << port << ": " << std::strerror(errno);
    }
    // Every read below ends within 10 s whatever the server does.
    timeval timeout{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~LoopbackSocket() { ::close(fd_); }
  LoopbackSocket(const LoopbackSocket&) = delete;
  LoopbackSocket& operator=(const LoopbackSocket&) = delete;

  void Send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  int fd() const { return fd_; }
  // recv's result: 0 when the server closed the connection.
  ssize_t Receive() {
    char buffer[256];
    return ::recv(fd_, buffer, sizeof(buffer), 0);
  }

 private:
  int fd_ = -1;
};

TEST(MetricsHttpTest, ScrapeIsServedWhileSixteenSlowClientsHoldConnections) {
  ServerMetrics metrics;
  metrics.RecordStep("cpu", Step(5));
  // A starved scrape would wait for a slow client's thread, so the slow
  // clients may hold theirs for a minute: far beyond the scrape's own
  // 10 s timeouts, which a loaded CI machine's scheduling cannot reach
  // (with 1 s timeouts this test failed once under ctest -j2).
  MetricsHttpOptions options;
  options.header_read_timeout = absl::Seconds(60);
  options.request_timeout = absl::Seconds(60);
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &metrics, options);
  ASSERT_THAT(server, IsOk());
  // Slowloris: each sends part of a request line and headers, then stalls.
  // httplib's default pool (max(8, cores - 1) threads, 5 s per read) would
  // give all its threads to them.
  std::vector<std::unique_ptr<LoopbackSocket>> slow;
  for (int client_idx = 0; client_idx < 16; ++client_idx) {
    slow.push_back(std::make_unique<LoopbackSocket>((*server)->port()));
    slow.back()->Send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
  }
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(10, 0);
  const absl::Time start = absl::Now();
  httplib::Result result = client.Get("/metrics");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_THAT(result->body, HasSubstr("megatrain_tokens_total 5"));
  EXPECT_LT(took, absl::Seconds(10));
}

TEST(MetricsHttpTest, ClientThatSendsNothingIsDisconnectedAfterTheHeaderReadTimeout) {
  ServerMetrics metrics;
  MetricsHttpOptions options;
  options.header_read_timeout = absl::Milliseconds(200);
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &metrics, options);
  ASSERT_THAT(server, IsOk());
  LoopbackSocket idle((*server)->port());
  idle.Send("GET /metr");
  const absl::Time start = absl::Now();
  EXPECT_EQ(idle.Receive(), 0) << "the server should close the connection";
  // 200 ms plus scheduling; far below the socket's 10 s receive timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(MetricsHttpTest, TricklingClientIsDisconnectedAtTheRequestTimeout) {
  ServerMetrics metrics;
  metrics.RecordStep("cpu", Step(9));
  MetricsHttpOptions options;
  options.max_connections = 1;  // the trickler holds the only thread
  options.header_read_timeout = absl::Seconds(2);
  options.request_timeout = absl::Milliseconds(500);
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &metrics, options);
  ASSERT_THAT(server, IsOk());
  LoopbackSocket trickler((*server)->port());
  const absl::Time start = absl::Now();
  // One byte every 100 ms: each read is far inside header_read_timeout, so
  // only the whole-request deadline can end it. 40 bytes take 4 s.
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaa";
  bool closed = false;
  for (size_t byte_idx = 0; byte_idx < request.size(); ++byte_idx) {
    if (::send(trickler.fd(), request.data() + byte_idx, 1, MSG_NOSIGNAL) != 1) {
      closed = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // the client's pace, not a wait for the server
  }
  if (!closed) EXPECT_EQ(trickler.Receive(), 0) << "the server should have closed the connection";
  // 500 ms plus scheduling; well below the 4 s the trickle would take.
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  // The thread is free again: a scrape is answered.
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_read_timeout(2, 0);
  httplib::Result result = client.Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_THAT(result->body, HasSubstr("megatrain_tokens_total 9"));
}

TEST(MetricsHttpTest, BadOptionsAreInvalidArgument) {
  ServerMetrics metrics;
  MetricsHttpOptions options;
  options.max_connections = 0;
  EXPECT_THAT(MetricsHttpServer::Start("127.0.0.1:0", &metrics, options),
              ::megatrain::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("max_connections")));
  options = MetricsHttpOptions();
  options.request_timeout = absl::ZeroDuration();
  EXPECT_THAT(MetricsHttpServer::Start("127.0.0.1:0", &metrics, options),
              ::megatrain::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("timeouts must be positive")));
}

// Note [Not applicable on the CPU] in metrics.h: a CPU step's memcpy
// "copies" and its zero MFU make no series at all.
TEST(MetricsTest, CpuStepsExportNoPcieOrMfuSeries) {
  ServerMetrics metrics;
  metrics.RecordStep("cpu", Step(1024));  // 1000 B "H2D", MFU 0.4 in the report
  std::string text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_tokens_per_second{device=\"cpu\"}"));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_pcie_bytes_total{")));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_pcie_bandwidth_bytes_per_second{")));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_pcie_link_estimate_bytes_total{")));
  EXPECT_THAT(text, Not(HasSubstr("megatrain_mfu_ratio{")));
  metrics.ClearDevice("cpu");
  EXPECT_THAT(metrics.TextExposition(), Not(HasSubstr("megatrain_mfu_ratio{")));
  metrics.RecordStep("cuda:0", Step(1024));
  text = metrics.TextExposition();
  EXPECT_THAT(text, HasSubstr("megatrain_pcie_bytes_total{direction=\"h2d\"} 1000"));
  EXPECT_THAT(text, HasSubstr("megatrain_mfu_ratio{device=\"cuda:0\"} 0.4"));
}

}  // namespace
}  // namespace megatrain::server
