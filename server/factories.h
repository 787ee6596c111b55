// The production wiring point of the core: which SourceManager handoffd runs and how it
// builds a source's provider (consumer/provider/: the libcurl polling and SSE adapters)
// and external sink (consumer/sinks/: the gRPC EventSink client).
//
// The provider API key is read here, from the environment variable or file the spec
// names; errors say where it was looked for, never what it is. Local-rows sources need
// no external sink (nullptr).
//
// Only handoffd's composition root (flags.cc) depends on this target, so the server
// library and its tests link no engine.
//
// Thread-safe (stateless).
#ifndef HANDOFF_SERVER_FACTORIES_H_
#define HANDOFF_SERVER_FACTORIES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "consumer/source_manager.h"

namespace handoff::server {

consumer::Factories ProductionFactories();

// consumer::SourceManager::Create.
absl::StatusOr<std::unique_ptr<consumer::SourceManager>> CreateProductionSourceManager(
    consumer::SourceManagerOptions options);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_FACTORIES_H_
