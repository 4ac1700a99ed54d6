// Issue 36: every string another user controls reaches the terminal
// escaped (client/output.h Printable): C0 and C1 controls (U+009B is an
// 8-bit CSI), bidirectional overrides (U+202E), bytes that are not UTF-8;
// in every human view (list, get, checkpoints, events, audit, status).
#include <string>

#include "client/output.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

using ::testing::HasSubstr;

// UTF-8 of U+009B (CSI), U+202E (RIGHT-TO-LEFT OVERRIDE), U+2066 (LRI).
const std::string kCsi = "\xc2\x9b";
const std::string kRlo = "\xe2\x80\xae";
const std::string kLri = "\xe2\x81\xa6";
// A hostile name: 7-bit and 8-bit CSI sequences, an override, a raw 0x9b.
const std::string kHostile = "a\x1b[2J" + kCsi + "31m" + kRlo + "txt.exe" + kLri + "\x9b" + "z";

// True when `text` holds none of the hostile characters raw.
bool Clean(const std::string& text) {
  return text.find('\x1b') == std::string::npos && text.find(kCsi) == std::string::npos &&
         text.find(kRlo) == std::string::npos && text.find(kLri) == std::string::npos &&
         text.find('\x9b') == std::string::npos;
}

TEST(PrintableTest, EscapesC0C1BidiAndNonUtf8Bytes) {
  EXPECT_EQ(Printable(kHostile), "a\\x1b[2J\\u009b31m\\u202etxt.exe\\u2066\\x9bz");
}

TEST(PrintableTest, KeepsOrdinaryUtf8) {
  const std::string text = "r\xc3\xa9sum\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80";
  EXPECT_EQ(Printable(text), text);
}

TEST(PrintableTest, RefusesOverlongAndTruncatedSequences) {
  // 0xc0 0xaf is an overlong '/', 0xe2 0x80 a truncated 3-byte sequence.
  EXPECT_EQ(Printable("\xc0\xaf|\xe2\x80"), "\\xc0\\xaf|\\xe2\\x80");
}

TEST(PrintableTest, EveryHumanViewEscapesUserStrings) {
  v1::Job job;
  job.set_id("job-000001");
  job.set_owner(kHostile);
  job.mutable_spec()->set_name(kHostile);
  job.mutable_spec()->set_output_dir("/out/" + kHostile);
  job.set_status_message(kHostile);
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = job;
  v1::ListCheckpointsResponse checkpoints;
  checkpoints.add_checkpoints()->set_dir("/out/" + kHostile);
  v1::JobEvent event;
  event.set_job_id("job-000001");
  event.mutable_state_change()->set_message(kHostile);
  v1::ListAuditRecordsResponse audit;
  v1::AuditRecord* record = audit.add_records();
  record->set_user(kHostile);
  record->set_target(kHostile);
  record->set_message(kHostile);
  record->set_detail(kHostile);
  for (const std::string& view : {JobTable(jobs), JobDetails(job), CheckpointTable(checkpoints),
                                  EventLine(event), AuditTable(audit)}) {
    EXPECT_TRUE(Clean(view)) << view;
    EXPECT_THAT(view, HasSubstr("\\u202e"));
  }
}

TEST(JobDetailsTest, ShowsTheResolvedNvmeTier) {
  v1::Job job;
  job.set_id("job-000001");
  job.mutable_spec()->mutable_memory()->set_nvme_tier("off");
  EXPECT_THAT(JobDetails(job), ::testing::ContainsRegex("NVMe tier: +off\n"));
}

// model.init_from: the checkpoint and the optimizer's word (fresh when the
// proto leaves it empty); no row for a job that does not start from one.
TEST(JobDetailsTest, ShowsTheCheckpointAJobStartsFrom) {
  v1::Job job;
  job.set_id("job-000002");
  EXPECT_THAT(JobDetails(job), ::testing::Not(HasSubstr("init from:")));
  job.mutable_spec()->mutable_model()->mutable_init_from()->set_checkpoint("job-000001/step-4");
  EXPECT_THAT(JobDetails(job),
              ::testing::ContainsRegex("init from: +job-000001/step-4 \\(optimizer fresh\\)\n"));
  job.mutable_spec()->mutable_model()->mutable_init_from()->set_optimizer("restore");
  EXPECT_THAT(JobDetails(job), HasSubstr("job-000001/step-4 (optimizer restore)"));
}

}  // namespace
}  // namespace megatrain::client
