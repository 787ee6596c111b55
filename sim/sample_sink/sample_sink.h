// SampleSink: a small downstream service implementing handoff.v1.EventSink (plus the
// SampleSinkAdmin control service) over gRPC, for tests, benchmarks and the demo.
//
// It records each delivery durably in its own RocksDB, keyed by the idempotency key (a key
// is recorded once; replays answer ALREADY_APPLIED and raise the key's attempt count), and
// misbehaves on demand (FaultConfig: fail N calls, reject / review / ignore matching
// events, be slow, crash around the N-th record, no batch API, short batch answers).
// The behaviour lives in SinkCore; this class only owns the server.
//
// Lifecycle: Start() -> serving -> Stop() (idempotent; the destructor calls it). Thread-
// safe: every method may be called from any thread while serving.
#ifndef HANDOFF_SIM_SAMPLE_SINK_SAMPLE_SINK_H_
#define HANDOFF_SIM_SAMPLE_SINK_SAMPLE_SINK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "sim/sample_sink/sample_sink_admin.pb.h"
#include "sim/sample_sink/sink_core.h"

namespace handoff::sim {

class SampleSink {
 public:
  struct Options {
    // Idempotency table, sync, faults, crash hook (see SinkCore::Options).
    SinkCore::Options core;
    // Listening address; port 0 picks a free port (see port()).
    std::string host = "127.0.0.1";
    int port = 0;
    // TLS of the port (both services), as PEM text. Both empty: plaintext.
    std::string tls_cert_chain;
    std::string tls_private_key;
    // With TLS: require a client certificate these PEM roots verify (mTLS).
    std::string tls_client_ca;
    // Non-empty: EventSink calls must carry `authorization: Bearer <bearer_token>`; any
    // other is answered UNAUTHENTICATED (its message names no token) and recorded
    // nowhere. SampleSinkAdmin stays open (it is the harness's).
    std::string bearer_token;
  };

  // Opens the table and starts serving EventSink and SampleSinkAdmin (plaintext unless
  // options.tls_*). INVALID_ARGUMENT for half a TLS pair, or a client CA without it.
  static absl::StatusOr<std::unique_ptr<SampleSink>> Start(Options options);

  SampleSink(const SampleSink&) = delete;
  SampleSink& operator=(const SampleSink&) = delete;
  ~SampleSink();

  // The bound port.
  int port() const { return port_; }
  // "host:port", ready for grpc::CreateChannel.
  std::string target() const;

  // Fails in-flight and later calls (UNAVAILABLE) and stops the server. The table stays
  // readable (Records, stats) until destruction, which closes it (then the same db_path
  // may be opened again: a restart).
  void Stop();

  void SetFaults(const handoff::sim::v1::FaultConfig& faults) { core_->SetFaults(faults); }
  handoff::sim::v1::FaultConfig faults() const { return core_->faults(); }
  handoff::sim::v1::Stats stats() const { return core_->stats(); }
  // Every durable record (request as first recorded, attempts), by idempotency key.
  absl::StatusOr<std::map<std::string, SinkRecord>> Records() const { return core_->Records(); }
  // See SinkCore::WaitForCalls.
  bool WaitForCalls(uint64_t n, absl::Duration timeout) const {
    return core_->WaitForCalls(n, timeout);
  }

 private:
  class EventSinkService;
  class AdminService;

  SampleSink() = default;

  // Destroyed in reverse order: the server (whose handlers use the services and the core)
  // goes first, then the services, then the core (which closes the table).
  std::unique_ptr<SinkCore> core_;
  std::unique_ptr<EventSinkService> sink_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string host_;
  int port_ = 0;

  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_SAMPLE_SINK_SAMPLE_SINK_H_
