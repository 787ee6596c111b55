// Declared sources: the --sources_config file (protobuf text format of
// handoff.v1.SourcesConfig, a Kubernetes ConfigMap in production), applied at start.
//
// For each declared source, in file order:
//  * unknown id: CreateSource(spec, start). The core validates the spec, so a bad field
//    fails start-up with the core's message prefixed by "sources_config: sources[i]".
//  * known id, same spec (the core's idempotent CreateSource accepts it): nothing
//    changes.
//  * `start` applies only when the file creates the source. A source that exists keeps
//    its stored desired_running whatever `start` says: StartSource and StopSource (the
//    operator's decisions) win over the file at every start, so a source stopped on
//    purpose stays stopped across restarts, and setting `start: true` later on a source
//    that exists does not start it (StartSource does). Recover has already started the
//    sources that were running.
//  * known id, different spec: the changed fields are classified. A change of the
//    identity (provider_url, chain, source, filter), the start position or the sink
//    (kind, target, gate, ...) is refused: FAILED_PRECONDITION naming the fields, and
//    the server does not start. Such a change needs an explicit operator decision
//    (DeleteSource + CreateSource, or RebuildSource). Any other change is "safe":
//    transport, page_limit, api_key (the reference, never the key) and failure_policy;
//    see ApplySourcesConfig about applying it.
//
// Thread-compatible (pure functions over a thread-safe SourceManager).
#ifndef HANDOFF_SERVER_SOURCES_CONFIG_H_
#define HANDOFF_SERVER_SOURCES_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "consumer/source_manager.h"
#include "handoff/v1/config.pb.h"
#include "server/logging.h"

namespace handoff::server {

// Parses the file; INVALID_ARGUMENT with the line and column of a syntax error.
absl::StatusOr<handoff::v1::SourcesConfig> LoadSourcesConfig(const std::string& path);
absl::StatusOr<handoff::v1::SourcesConfig> ParseSourcesConfig(const std::string& text);

// Applies `config` (see above): a new source is created; an existing one whose spec
// changed safely is updated in place (SourceManager::UpdateSource); an unsafe change is
// refused naming the fields. Returns the first refusal; sources before it are applied.
// A source that cannot start (as created or updated: an api_key naming an unset
// variable, ...) is no refusal: it halts as CONFIG_INVALID, logged, and the rest goes on.
absl::Status ApplySourcesConfig(const handoff::v1::SourcesConfig& config,
                                consumer::SourceManager* manager, Logger* logger);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_SOURCES_CONFIG_H_
