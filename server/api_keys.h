// ResolveApiKey: reads a source's provider API key from the environment variable or file
// its spec names (SecretRef), under the process's ApiKeyPolicy. ResolveSinkToken: the
// same for the bearer token of its downstream sink (sink.downstream.token), under the
// same policy: both are secrets a spec names and handoffd sends to a peer the spec names.
//
// Invariants:
//  * No error ever carries the key: they name the source and where the key was looked
//    for, never what it is.
//  * Under a policy, a spec can name only the keys the deployment put there for it:
//    files inside `dir` (after symlinks are resolved: a Kubernetes Secret volume's files
//    are links into it) and variables starting with `env_prefix`. An operator of the
//    admin API could otherwise point a source at any readable file or variable of the
//    process and have it sent, as a bearer token, to a provider URL of their choice.
//
// Thread-safe (stateless).
#ifndef HANDOFF_SERVER_API_KEYS_H_
#define HANDOFF_SERVER_API_KEYS_H_

#include <string>

#include "absl/status/statusor.h"
#include "handoff/v1/source.pb.h"

namespace handoff::server {

struct ApiKeyPolicy {
  // Non-empty: api_key.file (and sink.downstream.token.file) must lie inside this
  // directory (--api_key_dir).
  std::string dir;
  // Non-empty: api_key.env (and sink.downstream.token.env) must start with this
  // (--api_key_env_prefix).
  std::string env_prefix;
};

// The key `spec` names ("" without api_key). FAILED_PRECONDITION when it is unset, empty,
// unreadable, holds characters an HTTP header cannot carry, or lies outside the policy.
absl::StatusOr<std::string> ResolveApiKey(const handoff::v1::SourceSpec& spec,
                                          const ApiKeyPolicy& policy);

// The token sink.downstream.token names ("" without one, or without a downstream sink).
// Errors as ResolveApiKey's, naming sink.downstream.token.
absl::StatusOr<std::string> ResolveSinkToken(const handoff::v1::SourceSpec& spec,
                                             const ApiKeyPolicy& policy);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_API_KEYS_H_
