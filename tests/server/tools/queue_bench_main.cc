// megatrain-queue-bench: latency of JobManager::Submit and Get with a long
// queue (issue 14: "Submit, Get and scheduling cost do not grow with the
// queue"). Not a test: it prints numbers for docs/performance.md and asserts
// nothing about them (timings depend on the machine and its load).
//
// It opens a fresh JobStore in a temporary directory, starts a JobManager
// over the fake engine (tests/server/fake_engine_backend.h, gated: the first
// job holds the only device, so every later job stays QUEUED), submits
// --jobs jobs from --users users (spread over priorities -2..2) and times
// every Submit, then --gets GetJob calls of random queued jobs.
//
// Usage: megatrain-queue-bench [--jobs 10000] [--users 100] [--gets 2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "server/core/job_manager.h"
#include "server/core/job_store.h"
#include "server/core/metrics.h"
#include "tests/testing/temp_dir.h"
#include "tests/server/fake_engine_backend.h"

namespace megatrain::server {
namespace {

using Clock = std::chrono::steady_clock;

double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// `fraction` quantile (nearest rank) of `samples_ms`; sorts them.
double Quantile(std::vector<double>& samples_ms, double fraction) {
  if (samples_ms.empty()) return 0;
  std::sort(samples_ms.begin(), samples_ms.end());
  const size_t rank = static_cast<size_t>(fraction * static_cast<double>(samples_ms.size() - 1));
  return samples_ms[rank];
}

void Report(const char* what, std::vector<double> samples_ms) {
  const double p50 = Quantile(samples_ms, 0.50);
  const double p99 = Quantile(samples_ms, 0.99);
  std::printf("| %-40s | %6zu | %8.2f | %8.2f | %8.2f |\n", what, samples_ms.size(), p50, p99,
              samples_ms.back());
}

JobRequest Request(int job_idx) {
  JobRequest request;
  request.spec.name = absl::StrCat("bench-", job_idx);
  request.spec.model.preset = "tiny";
  request.spec.data.tokens = "/data/tiny";
  request.spec.train.max_steps = 100;
  request.priority = job_idx % 5 - 2;
  return request;
}

int Run(int jobs, int users, int gets) {
  const std::string dir = testing::MakeTempDir();
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir + "/megatrain.db");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  testing::FakeEngineBackend backend;
  backend.gated = true;
  ServerMetrics metrics;
  JobManagerOptions options;
  options.jobs_dir = dir + "/jobs";
  options.devices = {"cpu"};
  options.host_memory_budget_bytes = int64_t{1} << 40;
  // Limits on (as in production) but never reached: their counts are timed.
  options.max_queued_jobs = jobs + 1;
  options.max_queued_jobs_per_user = jobs;
  absl::StatusOr<std::unique_ptr<JobManager>> manager =
      JobManager::Create(options, store->get(), &backend, &metrics);
  if (!manager.ok()) {
    std::fprintf(stderr, "%s\n", manager.status().ToString().c_str());
    return 1;
  }
  std::vector<Principal> principals;
  for (int user_idx = 0; user_idx < users; ++user_idx) {
    principals.push_back(Principal{absl::StrCat("user", user_idx), Role::kUser});
  }
  std::vector<double> submit_first_ms, submit_last_ms, submit_all_ms;
  std::vector<std::pair<Principal, std::string>> submitted;
  for (int job_idx = 0; job_idx < jobs; ++job_idx) {
    const Principal& caller = principals[job_idx % users];
    const Clock::time_point start = Clock::now();
    absl::StatusOr<JobRecord> job = (*manager)->Submit(caller, Request(job_idx), "");
    const double ms = Milliseconds(Clock::now() - start);
    if (!job.ok()) {
      std::fprintf(stderr, "submit %d: %s\n", job_idx, job.status().ToString().c_str());
      return 1;
    }
    submit_all_ms.push_back(ms);
    if (job_idx < 1000) submit_first_ms.push_back(ms);
    if (job_idx >= jobs - 1000) submit_last_ms.push_back(ms);
    submitted.emplace_back(caller, job->id);
  }
  std::mt19937 rng(14);
  std::uniform_int_distribution<size_t> pick(1, submitted.size() - 1);
  std::vector<double> get_ms;
  int64_t position_sum = 0;
  for (int get_idx = 0; get_idx < gets; ++get_idx) {
    const auto& [caller, id] = submitted[pick(rng)];
    const Clock::time_point start = Clock::now();
    absl::StatusOr<JobRecord> job = (*manager)->Get(caller, id);
    get_ms.push_back(Milliseconds(Clock::now() - start));
    if (!job.ok()) {
      std::fprintf(stderr, "get %s: %s\n", id.c_str(), job.status().ToString().c_str());
      return 1;
    }
    position_sum += job->queue_position;
  }
  std::printf(
      "%d jobs from %d users (1 running, %d queued); %d GetJob of random queued jobs "
      "(mean queue_position %.0f)\n\n",
      jobs, users, jobs - 1, gets, static_cast<double>(position_sum) / gets);
  std::printf("| %-40s | %6s | %8s | %8s | %8s |\n", "call", "n", "p50 ms", "p99 ms", "max ms");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(8, '-').c_str(),
              std::string(10, '-').c_str(), std::string(10, '-').c_str(),
              std::string(10, '-').c_str());
  Report("Submit, first 1000 (queue 0..1000)", submit_first_ms);
  Report(absl::StrCat("Submit, last 1000 (queue ", jobs - 1000, "..", jobs, ")").c_str(),
         submit_last_ms);
  Report("Submit, all", submit_all_ms);
  Report(absl::StrCat("GetJob (queue ", jobs - 1, ")").c_str(), get_ms);
  (*manager)->Drain(absl::Seconds(30));
  ::megatrain::testing::RemoveTestTree(dir);
  return 0;
}

}  // namespace
}  // namespace megatrain::server

int main(int argc, char** argv) {
  CLI::App app("megatrain-queue-bench: Submit and GetJob latency with a long queue");
  int jobs = 10000;
  int users = 100;
  int gets = 2000;
  app.add_option("--jobs", jobs, "Jobs to submit (>= 1001)")->check(CLI::Range(1001, 1000000));
  app.add_option("--users", users, "Distinct submitting users")->check(CLI::Range(1, 100000));
  app.add_option("--gets", gets, "GetJob calls to time")->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);
  return megatrain::server::Run(jobs, users, gets);
}
