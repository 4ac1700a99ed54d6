// Issue 14, "nothing unbounded from untrusted callers", below the RPC layer:
// the string caps of every request (Note [String caps], proto_convert.h),
// error messages that quote a bounded, escaped part of the input, reply
// messages cut by RpcCall, the audit log's per-field caps, its per-peer
// rate limit of refused-authentication records and its fail-closed check
// (Note [Audit fail closed]), and the escaping of control characters in the
// daemon's log and the CLI's human output. The same rules through a real
// daemon are in daemon_hardening_test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/output.h"
#include "server/core/audit_log.h"
#include "server/core/logging.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/rpc_call.h"
#include "tests/server/fake_engine_backend.h"
#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::server::testing::MakeTempDir;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// --- escaping and quoting ---

TEST(EscapeTest, ControlCharactersAreEscapedAndUtf8IsKept) {
  EXPECT_EQ(EscapeControlCharacters("a\nb\rc\td\x1b[31me\x7f\x01 \xc3\xa9"),
            "a\\nb\\rc\\td\\x1b[31me\\x7f\\x01 \xc3\xa9");
  EXPECT_EQ(client::Printable("job\n2026 ERROR forged\x1b]0;title\x07"),
            "job\\n2026 ERROR forged\\x1b]0;title\\x07");
}

TEST(EscapeTest, QuoteForErrorCutsLongInputOnACharacterBoundary) {
  EXPECT_EQ(QuoteForError("x\ny"), "'x\\ny'");
  // 300 two-byte characters: cut at most kMaxQuotedInputBytes in, whole.
  std::string accents;
  for (int idx = 0; idx < 300; ++idx) accents += "\xc3\xa9";
  const std::string quoted = QuoteForError(accents);
  EXPECT_LE(quoted.size(), kMaxQuotedInputBytes + 32);
  EXPECT_THAT(quoted, HasSubstr("...' (600 bytes)"));
  EXPECT_EQ(quoted.find("\xc3..."), std::string::npos) << "cut inside a character";
}

TEST(EscapeTest, ReplyMessagesAreCutToTheCap) {
  const absl::Status long_status =
      absl::PermissionDeniedError(std::string(5 * kMaxStatusMessageBytes, 'p'));
  const absl::Status capped = CapStatusMessage(long_status);
  EXPECT_EQ(capped.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_LE(capped.message().size(), kMaxStatusMessageBytes);
  EXPECT_THAT(std::string(capped.message()), HasSubstr("... (message cut)"));
  const absl::Status short_status = absl::NotFoundError("job job-1 not found");
  EXPECT_EQ(CapStatusMessage(short_status), short_status);
}

// --- string caps ---

TEST(StringCapsTest, EveryRequestFieldOverItsCapIsInvalidArgumentNamingIt) {
  const std::string id(kMaxIdBytes + 1, 'i');
  v1::GetJobRequest get;
  get.set_job_id(id);
  EXPECT_THAT(CheckRequestBounds(get),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job_id: 129 bytes, more than the 128 allowed (starts 'iii")));
  v1::DeleteCheckpointRequest remove;
  remove.set_checkpoint_id(id);
  EXPECT_THAT(CheckRequestBounds(remove),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint_id: 129 bytes")));
  v1::ExportCheckpointRequest export_request;
  export_request.set_checkpoint_id("job-000001/step-2");
  export_request.set_out_dir("/" + std::string(kMaxPathBytes, 'o'));
  EXPECT_THAT(CheckRequestBounds(export_request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_dir: 4097 bytes")));
  export_request.set_out_dir("/out");
  export_request.set_dtype(std::string(kMaxKeywordBytes + 1, 'd'));
  EXPECT_THAT(CheckRequestBounds(export_request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype: 65 bytes")));
  v1::ListJobsRequest list;
  list.set_owner(std::string(kMaxUserNameBytes + 1, 'u'));
  EXPECT_THAT(CheckRequestBounds(list),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("owner: 65 bytes")));
  v1::ListAuditRecordsRequest audit;
  audit.set_method(std::string(kMaxKeywordBytes + 1, 'm'));
  EXPECT_THAT(CheckRequestBounds(audit),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("method: 65 bytes")));
  v1::GetMetricsRequest metrics;
  metrics.set_name_prefix(std::string(kMaxMetricPrefixBytes + 1, 'n'));
  EXPECT_THAT(CheckRequestBounds(metrics),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("name_prefix: 257 bytes")));
  v1::SubmitJobRequest submit;
  submit.set_request_id(std::string(kMaxRequestIdLength + 1, 'r'));
  EXPECT_THAT(CheckRequestBounds(submit),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request_id: 129 bytes")));
  // At the caps everything passes.
  get.set_job_id(std::string(kMaxIdBytes, 'i'));
  EXPECT_THAT(CheckRequestBounds(get), IsOk());
  list.set_owner(std::string(kMaxUserNameBytes, 'u'));
  list.set_page_token(std::string(kMaxPageTokenBytes, 't'));
  EXPECT_THAT(CheckRequestBounds(list), IsOk());
}

TEST(StringCapsTest, JobSpecStringsOverTheirCapsAreRefusedBeforeConversion) {
  v1::JobSpec spec;
  spec.set_name(std::string(kMaxJobNameBytes + 1, 'n'));
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.name: 257 bytes")));
  spec.set_name("ok");
  spec.mutable_model()->set_hf_dir("/" + std::string(kMaxPathBytes, 'h'));
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.hf_dir: 4097 bytes")));
  spec.mutable_model()->set_hf_dir("");
  (*spec.mutable_labels())["team"] = std::string(kMaxLabelValueLength + 1, 'v');
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels.team: 257 bytes")));
  spec.clear_labels();
  for (int label_idx = 0; label_idx <= kMaxLabels; ++label_idx) {
    (*spec.mutable_labels())[absl::StrCat("k", label_idx)] = "v";
  }
  EXPECT_THAT(JobRequestFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels: at most")));
}

TEST(StringCapsTest, ErrorMessagesQuoteABoundedEscapedPartOfTheInput) {
  v1::JobSpec spec;
  // A relative path of 4000 bytes with a newline: the message quotes at
  // most kMaxQuotedInputBytes of it, escaped.
  spec.set_output_dir("rel\n" + std::string(3996, 'x'));
  absl::StatusOr<JobRequest> request = JobRequestFromProto(spec);
  ASSERT_THAT(request, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output_dir")));
  const std::string message(request.status().message());
  EXPECT_LT(message.size(), 200 + kMaxQuotedInputBytes);
  EXPECT_THAT(message, HasSubstr("'rel\\nxxx"));
  EXPECT_THAT(message, Not(HasSubstr("\n")));
}

// --- audit log ---

class AuditBoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    auto store = JobStore::Open(dir_ + "/megatrain.db");
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
  }

  std::unique_ptr<AuditLog> OpenLog(AuditLogOptions options) {
    auto log = AuditLog::Open(store_.get(), std::move(options));
    EXPECT_THAT(log, IsOk());
    return log.ok() ? *std::move(log) : nullptr;
  }

  std::vector<AuditRecord> All(AuditLog& log) {
    AuditQuery query;
    query.page_size = 1000;
    absl::StatusOr<AuditPage> page = log.List({"root", Role::kAdmin}, query);
    EXPECT_THAT(page, IsOk());
    return page.ok() ? page->records : std::vector<AuditRecord>{};
  }

  std::string dir_;
  std::unique_ptr<JobStore> store_;
};

AuditRecord Refused(const std::string& peer) {
  AuditRecord record;
  record.peer = peer;
  record.method = "CancelJob";
  record.target = "job-000001";
  record.code = absl::StatusCode::kUnauthenticated;
  record.message = "invalid bearer token";
  return record;
}

TEST_F(AuditBoundsTest, EveryFieldIsCutToItsCap) {
  std::unique_ptr<AuditLog> log = OpenLog({});
  AuditRecord record;
  record.user = std::string(1000, 'u');
  record.role = std::string(1000, 'r');
  record.peer = std::string(1000, 'p');
  record.method = std::string(1000, 'm');
  record.target = std::string(100000, 't');
  record.job_id = std::string(100000, 'j');
  record.code = absl::StatusCode::kInvalidArgument;
  record.message = std::string(100000, 'x');
  record.detail = std::string(100000, 'd');
  log->Record(record);
  const std::vector<AuditRecord> records = All(*log);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].user.size(), kMaxAuditUserBytes);
  EXPECT_EQ(records[0].role.size(), kMaxAuditRoleBytes);
  EXPECT_EQ(records[0].peer.size(), kMaxAuditPeerBytes);
  EXPECT_EQ(records[0].method.size(), kMaxAuditMethodBytes);
  EXPECT_EQ(records[0].target.size(), kMaxAuditTargetBytes);
  EXPECT_EQ(records[0].job_id.size(), kMaxAuditTargetBytes);
  EXPECT_EQ(records[0].message.size(), kMaxAuditTextBytes);
  EXPECT_EQ(records[0].detail.size(), kMaxAuditTextBytes);
  EXPECT_THAT(records[0].target, ::testing::EndsWith("..."));
}

TEST_F(AuditBoundsTest, RefusedAuthenticationIsRateLimitedPerPeerAddress) {
  std::unique_ptr<AuditLog> log = OpenLog({});
  // Ports differ (new connections); the address is what counts.
  for (int call_idx = 0; call_idx < 3 * kRefusedAuthBurst; ++call_idx) {
    log->Record(Refused(absl::StrCat("ipv4:10.0.0.7:", 40000 + call_idx)));
  }
  // Another address has a burst of its own.
  log->Record(Refused("ipv6:[fd00::1]:5555"));
  std::vector<AuditRecord> records = All(*log);
  // Refills (one per kRefusedAuthRefill) cannot happen in this short test.
  EXPECT_EQ(records.size(), static_cast<size_t>(kRefusedAuthBurst) + 1);
  EXPECT_EQ(log->refused_auth_dropped(), 2 * kRefusedAuthBurst);
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:40001"), "ipv4:10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[fd00::1]:5555"), "ipv6:[fd00::1]");
  EXPECT_EQ(PeerHost("unix:/run/megatrain.sock"), "unix:/run/megatrain.sock");
}

TEST_F(AuditBoundsTest, AuthenticatedRecordsAreNeverRateLimited) {
  std::unique_ptr<AuditLog> log = OpenLog({});
  for (int call_idx = 0; call_idx < 3 * kRefusedAuthBurst; ++call_idx) {
    AuditRecord record = Refused("ipv4:10.0.0.7:1");
    record.user = "alice";
    record.code = absl::StatusCode::kPermissionDenied;
    log->Record(record);
  }
  EXPECT_EQ(All(*log).size(), static_cast<size_t>(3 * kRefusedAuthBurst));
}

TEST_F(AuditBoundsTest, NearlyFullStateDiskRefusesMutatingCalls) {
  AuditLogOptions options;
  options.space_check_dir = dir_;
  options.min_free_bytes = std::numeric_limits<int64_t>::max();  // no disk has that much free
  std::unique_ptr<AuditLog> log = OpenLog(options);
  EXPECT_THAT(log->CheckWritable(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("the daemon's state directory " + dir_ + " has")));
  options.min_free_bytes = 1;
  EXPECT_THAT(OpenLog(options)->CheckWritable(), IsOk());
}

TEST_F(AuditBoundsTest, AFailedWriteRefusesUntilARecordIsWrittenAgain) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  AuditLogOptions options;
  options.jsonl_path = "/dev/full";
  std::unique_ptr<AuditLog> log = OpenLog(options);
  EXPECT_THAT(log->CheckWritable(), IsOk());
  AuditRecord record = Refused("ipv4:127.0.0.1:1");
  record.user = "alice";
  record.code = absl::StatusCode::kOk;
  log->Record(record);
  EXPECT_THAT(log->CheckWritable(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("writing '/dev/full': No space left on device")));
}

}  // namespace
}  // namespace megatrain::server
