#include "server/status_util.h"

#include "gtest/gtest.h"

namespace handoff::server {
namespace {

TEST(ToGrpcStatusTest, OkIsOk) { EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok()); }

TEST(ToGrpcStatusTest, EveryCanonicalCodeKeepsItsNumberAndMessage) {
  for (int c = 1; c <= 16; ++c) {
    const absl::Status in(static_cast<absl::StatusCode>(c), "spec.id: bad");
    const grpc::Status out = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(out.error_code()), c);
    EXPECT_EQ(out.error_message(), "spec.id: bad");
  }
}

TEST(ToGrpcStatusTest, NamedCodesMatch) {
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::AbortedError("x")).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("x")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(ToGrpcStatusTest, NonCanonicalCodeIsUnknown) {
  const absl::Status in(static_cast<absl::StatusCode>(42), "odd");
  EXPECT_EQ(ToGrpcStatus(in).error_code(), grpc::StatusCode::UNKNOWN);
}

}  // namespace
}  // namespace handoff::server
