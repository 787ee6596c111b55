// Bearer-token authentication and role authorization of the admin API.
//
// Token file (a Kubernetes Secret mounted read-only), one token a line:
//
//     # name      role      token
//     deploy-bot  operator  3f9c0d6e8a2b4c71a5e0f7d9b8c6a4e2
//     dashboard   reader    b7e1c2d3f4a5968778695a4b3c2d1e0f
//
// Fields are separated by spaces or tabs; blank lines and lines starting with '#' are
// ignored. `name` ([A-Za-z0-9._@-]{1,64}) is what audit trails record (ResolveHold's
// actor); `role` is `reader` or `operator`; `token` is at least 16 printable, non-space
// characters. Names and tokens must be unique.
//
// A caller sends `authorization: Bearer <token>` metadata. No token or an unknown token
// is UNAUTHENTICATED, a known token whose role may not call the RPC is
// PERMISSION_DENIED.
//
// Invariants: a token never appears in a status message, a log line or a reply (errors
// about the file name its line number, never its content). Only SHA-256 digests of the
// tokens are kept, and a presented token is compared against every digest in constant
// time (no early exit, no length leak).
//
// Thread-safe: immutable after construction.
#ifndef HANDOFF_SERVER_AUTH_H_
#define HANDOFF_SERVER_AUTH_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ServerContext;
}

namespace handoff::server {

enum class Role { kReader, kOperator };

// What an RPC needs.
enum class Permission {
  kRead,     // Get/List/Watch/Query/GetProgress/ListHolds/GetHold/ListQuarantine
  kOperate,  // Create/Start/Stop/Delete/Rebuild/ResolveHold
};

struct Caller {
  std::string name;  // the token's name (audit actor); never the token
  Role role = Role::kReader;
};

class Authenticator {
 public:
  // Parses a token file's content. INVALID_ARGUMENT naming the line on a bad line.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromContent(absl::string_view content);
  // Reads and parses `path`; an empty file (no tokens) is INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);
  // Authentication disabled (--insecure_disable_auth): every caller is the operator
  // "anonymous".
  static std::unique_ptr<Authenticator> Disabled();

  // The caller of `authorization` metadata (the whole header value, e.g.
  // "Bearer abc..."), or UNAUTHENTICATED; then PERMISSION_DENIED if its role lacks
  // `permission`. `rpc` names the method in the denial message.
  absl::StatusOr<Caller> Authorize(absl::string_view authorization, Permission permission,
                                   absl::string_view rpc) const;
  // Same, reading the metadata of a call.
  absl::StatusOr<Caller> Authorize(const grpc::ServerContext& context, Permission permission,
                                   absl::string_view rpc) const;

  bool enabled() const { return enabled_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    Role role;
    std::array<unsigned char, 32> digest;  // SHA-256 of the token
  };

  Authenticator(bool enabled, std::vector<Entry> entries)
      : enabled_(enabled), entries_(std::move(entries)) {}

  // Constant after construction.
  const bool enabled_;
  const std::vector<Entry> entries_;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_AUTH_H_
