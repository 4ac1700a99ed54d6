// client/cli.h ExitCodeFor: one exit code per gRPC code (docs/api.md, "Exit
// codes"), none of them 0 or the job-outcome code 3.
#include <map>
#include <set>

#include "absl/status/status.h"
#include "client/cli.h"
#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

TEST(ExitCodeForTest, EveryErrorCodeHasItsOwnExitCode) {
  std::set<int> seen;
  for (int code = 1; code <= 16; ++code) {
    const int exit_code = ExitCodeFor(static_cast<absl::StatusCode>(code));
    EXPECT_NE(exit_code, kExitOk) << code;
    EXPECT_NE(exit_code, kExitJobNotSucceeded) << code;
    EXPECT_TRUE(seen.insert(exit_code).second)
        << absl::StatusCodeToString(static_cast<absl::StatusCode>(code)) << " shares exit code "
        << exit_code;
  }
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kOk), kExitOk);
}

// The codes docs/api.md documents, and the two scripts rely on (1: no
// daemon; 2: bad input).
TEST(ExitCodeForTest, DocumentedCodes) {
  const std::map<absl::StatusCode, int> documented = {
      {absl::StatusCode::kUnavailable, 1},       {absl::StatusCode::kInvalidArgument, 2},
      {absl::StatusCode::kNotFound, 4},          {absl::StatusCode::kAlreadyExists, 5},
      {absl::StatusCode::kPermissionDenied, 6},  {absl::StatusCode::kUnauthenticated, 7},
      {absl::StatusCode::kResourceExhausted, 8}, {absl::StatusCode::kFailedPrecondition, 9},
      {absl::StatusCode::kUnimplemented, 10},    {absl::StatusCode::kDataLoss, 11},
      {absl::StatusCode::kDeadlineExceeded, 12}, {absl::StatusCode::kInternal, 13},
      {absl::StatusCode::kAborted, 14},          {absl::StatusCode::kCancelled, 15},
      {absl::StatusCode::kOutOfRange, 16},       {absl::StatusCode::kUnknown, 17}};
  for (const auto& [code, exit_code] : documented) {
    EXPECT_EQ(ExitCodeFor(code), exit_code) << absl::StatusCodeToString(code);
  }
}

}  // namespace
}  // namespace megatrain::client
