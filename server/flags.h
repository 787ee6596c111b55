// handoffd's command-line flags, turned into ServerOptions. The flags themselves are
// defined in flags.cc (one place, with their help text); `handoffd --help` lists them.
//
//   --listen=127.0.0.1:7443     gRPC address (dev default: loopback; in Kubernetes pass
//                               0.0.0.0:7443). Port 0 picks a free port.
//   --health_listen=HOST:PORT   plaintext grpc.health.v1 only (Kubernetes probes)
//   --port_file=PATH            write `grpc|metrics|health <port>` lines here
//   --data_dir=PATH             required; RocksDB in PATH/db
//   --metrics_listen=HOST:PORT  Prometheus /metrics; empty disables it
//   --tls_cert, --tls_key       PEM server certificate chain and key (TLS on when set)
//   --tls_client_ca=PATH        PEM CA bundle: require and verify client certs (mTLS)
//   --auth_tokens_file=PATH     bearer tokens (auth.h); required unless
//   --insecure_disable_auth     development only; logged as a warning at start
//   --sources_config=PATH       declared sources, text handoff.v1.SourcesConfig
//   --log_level=info            debug|info|warning|error
//   --max_sources=10000         RESOURCE_EXHAUSTED beyond it
//   --max_message_bytes=4194304 largest request accepted
//   --max_watchers=256          concurrent WatchProgress streams
//   --max_page_bytes=67108864   largest page (poll body, SSE frame) a source accepts
//                               (65536..268435456; page_too_large above it)
//   --shutdown_grace=30s        bound of a graceful shutdown (server.h)
//
// Thread-compatible: call after absl::ParseCommandLine, from main.
#ifndef HANDOFF_SERVER_FLAGS_H_
#define HANDOFF_SERVER_FLAGS_H_

#include "absl/status/statusor.h"
#include "server/options.h"

namespace handoff::server {

// The options of the parsed flags, wired to the production core (factories.h) and to
// signal handling. INVALID_ARGUMENT naming the flag for a bad value.
absl::StatusOr<ServerOptions> OptionsFromFlags();

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_FLAGS_H_
