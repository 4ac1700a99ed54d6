// The CLI's step output (client/output.h): a data-parallel job's step
// shows the job's tokens/s and each device's; a 1-device step (or one from
// a daemon before issue 21, devices 0) shows the job's alone.
#include "client/output.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::JobEvent StepEvent(int32_t devices, double tokens_per_s, double device_tokens_per_s) {
  v1::JobEvent event;
  event.set_job_id("job-000001");
  v1::JobEvent::Step* step = event.mutable_step();
  step->set_step(3);
  step->set_max_steps(6);
  step->set_loss(2.5);
  step->set_tokens_per_s(tokens_per_s);
  step->set_devices(devices);
  step->set_device_tokens_per_s(device_tokens_per_s);
  return event;
}

// "mfu" is absent from --json output where the daemon does not know it
// (a CPU device), not 0.
TEST(OutputTest, JsonOmitsMfuWhereUnknown) {
  v1::Job job;
  job.set_id("job-000001");
  v1::JobEvent event;
  event.mutable_step()->set_step(1);

  EXPECT_FALSE(JobToJson(job)["progress"].contains("mfu"));
  EXPECT_FALSE(EventToJson(event).contains("mfu"));

  job.mutable_progress()->set_mfu(0.4);
  event.mutable_step()->set_mfu(0.4);
  EXPECT_EQ(JobToJson(job)["progress"]["mfu"], 0.4);
  EXPECT_EQ(EventToJson(event)["mfu"], 0.4);
}

TEST(OutputTest, DataParallelStepShowsTheJobsAndEachDevicesTokensPerSecond) {
  const v1::JobEvent two = StepEvent(2, 24000, 12000);
  EXPECT_THAT(ProgressLine("job-000001", two.step(), ""),
              HasSubstr("24,000 tok/s (2 devices, 12,000 each)"));
  const nlohmann::json j = EventToJson(two);
  EXPECT_EQ(j["tokens_per_s"], 24000);
  EXPECT_EQ(j["devices"], 2);
  EXPECT_EQ(j["device_tokens_per_s"], 12000);

  for (const int32_t devices : {0, 1}) {
    const v1::JobEvent one = StepEvent(devices, 24000, devices == 1 ? 24000 : 0);
    const std::string line = ProgressLine("job-000001", one.step(), "");
    EXPECT_THAT(line, HasSubstr("24,000 tok/s"));
    EXPECT_THAT(line, Not(HasSubstr("devices")));
    EXPECT_FALSE(EventToJson(one).contains("devices"));
  }
}

}  // namespace
}  // namespace megatrain::client
