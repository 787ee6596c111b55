#include "server/auth.h"

#include "gtest/gtest.h"

namespace handoff::server {
namespace {

constexpr char kFile[] =
    "# name role token\n"
    "\n"
    "ops     operator  operator-token-0123456789\n"
    "\tdash\treader\treader-token-0123456789  \n";

std::unique_ptr<Authenticator> Load() {
  auto auth = Authenticator::FromContent(kFile);
  EXPECT_TRUE(auth.ok()) << auth.status();
  return *std::move(auth);
}

TEST(AuthenticatorTest, ParsesNamesAndRoles) {
  auto auth = Load();
  EXPECT_TRUE(auth->enabled());
  EXPECT_EQ(auth->size(), 2u);
  auto op = auth->Authorize("Bearer operator-token-0123456789", Permission::kOperate, "X");
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->name, "ops");
  EXPECT_EQ(op->role, Role::kOperator);
  auto reader = auth->Authorize("bearer reader-token-0123456789", Permission::kRead, "X");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->name, "dash");
  EXPECT_EQ(reader->role, Role::kReader);
}

TEST(AuthenticatorTest, MissingOrUnknownTokenIsUnauthenticated) {
  auto auth = Load();
  EXPECT_EQ(auth->Authorize("", Permission::kRead, "GetSource").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->Authorize("Bearer nope-nope-nope-nope", Permission::kRead, "GetSource")
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth->Authorize("Basic b3BzOnB3", Permission::kRead, "GetSource").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A prefix of a valid token is not valid.
  EXPECT_EQ(auth->Authorize("Bearer operator-token-012345678", Permission::kRead, "GetSource")
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AuthenticatorTest, ReaderMayReadButNotOperate) {
  auto auth = Load();
  EXPECT_TRUE(auth->Authorize("Bearer reader-token-0123456789", Permission::kRead, "ListSources")
                  .ok());
  const absl::Status denied =
      auth->Authorize("Bearer reader-token-0123456789", Permission::kOperate, "CreateSource")
          .status();
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("CreateSource"), absl::string_view::npos);
  EXPECT_NE(denied.message().find("dash"), absl::string_view::npos);
  EXPECT_EQ(denied.message().find("reader-token"), absl::string_view::npos);
}

TEST(AuthenticatorTest, DisabledAdmitsEveryoneAsAnonymousOperator) {
  auto auth = Authenticator::Disabled();
  auto caller = auth->Authorize("", Permission::kOperate, "DeleteSource");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->name, "anonymous");
  EXPECT_EQ(caller->role, Role::kOperator);
}

TEST(AuthenticatorTest, BadFilesNameTheLineNeverTheToken) {
  struct Case {
    const char* content;
    const char* expect;
  } cases[] = {
      {"ops operator\n", "line 1"},
      {"ops admin secret-secret-secret-1\n", "role"},
      {"ops operator short\n", "at least 16"},
      {"o p operator secret-secret-secret-1\n", "line 1"},
      {"a reader secret-secret-secret-1\nb operator secret-secret-secret-1\n", "already used"},
      {"a reader secret-secret-secret-1\na operator secret-secret-secret-2\n", "duplicate name"},
      {"# only comments\n", "no tokens"},
      {"ops operator REPLACE-WITH-32-RANDOM-CHARACTERS-A\n", "placeholder"},
  };
  for (const Case& c : cases) {
    auto auth = Authenticator::FromContent(c.content);
    ASSERT_FALSE(auth.ok()) << c.content;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(auth.status().message().find(c.expect), absl::string_view::npos)
        << auth.status();
    EXPECT_EQ(auth.status().message().find("secret-secret"), absl::string_view::npos)
        << auth.status();
  }
}

TEST(AuthenticatorTest, MissingFileIsFailedPrecondition) {
  EXPECT_EQ(Authenticator::FromFile("/nonexistent/tokens").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace handoff::server
