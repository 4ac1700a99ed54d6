// GoogleTest matchers for absl::Status / StatusOr (Debian's Abseil has none):
//   EXPECT_THAT(status, IsOk());
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
//                                HasSubstr("train.micro_batch")));
#ifndef MEGATRAIN_TESTS_TESTING_STATUS_MATCHERS_H_
#define MEGATRAIN_TESTS_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + std::string(absl::StatusCodeToString(code))) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code && ::testing::Matches(message_matcher)(std::string(s.message()));
}

#define MEGATRAIN_ASSERT_OK(expr) ASSERT_THAT((expr), ::megatrain::testing::IsOk())
#define MEGATRAIN_EXPECT_OK(expr) EXPECT_THAT((expr), ::megatrain::testing::IsOk())

}  // namespace megatrain::testing

#endif  // MEGATRAIN_TESTS_TESTING_STATUS_MATCHERS_H_
