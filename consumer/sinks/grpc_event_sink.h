// GrpcEventSink: the ExternalSink that delivers events to a downstream service
// implementing handoff.v1.EventSink over one gRPC channel.
//
// Model: each Deliver() sends the deliveries in source order, as ApplyBatch calls of at
// most max_batch events when batching is on (and the sink implements it), else one Apply
// per event. Every RPC has its own deadline. The sink's outcome becomes the SinkAnswer
// kind one to one; anything that is not an outcome the sink stated for that event is
// kTransportError, never a receipt:
//   * an RPC that failed (DEADLINE_EXCEEDED, UNAVAILABLE, a lost connection, Cancel(), any
//     other gRPC error, including UNIMPLEMENTED for Apply);
//   * an event missing from a short ApplyBatch response (event_sink.proto counts these as
//     RETRY_LATER; Handoff treats them as transport errors so they never use up attempts);
//   * every event of an ApplyBatch response with more results than events: results carry
//     no key, so such a reply may not line up with the events and none is a receipt;
//   * an unknown or UNSPECIFIED outcome;
//   * the events after a failed RPC or a short or long response: they are not sent (the
//     call stops there, so later events never overtake an earlier one that failed).
// ApplyBatch answered UNIMPLEMENTED switches this sink to Apply for good (the same events
// are re-sent one by one; max_batch() becomes 1).
// Batch size: a chunk has at most max_batch() events and, unless it is a single event, at
// most kMaxRequestBytes encoded (gRPC servers take 4 MiB by default). An ApplyBatch of n > 1
// events answered RESOURCE_EXHAUSTED (a sink taking smaller requests, or out of quota)
// lowers max_batch() to n/2 for the rest of this sink's life: its events come back as
// transport errors, and their retry goes in smaller calls instead of failing the same way
// forever. A single event the sink refuses as too large is retried until an operator acts
// (the source shows BACKING_OFF with the sink's message).
// Send() of at most max_batch events is one ApplyBatch made with gRPC's callback API: the
// request is filled on the caller's thread and sent from there, and the answer is read
// by gRPC's own threads; no thread is started or woken to send (the delivery stage's
// lookahead, bench/HISTORY.md item 89). Its UNIMPLEMENTED answers nothing (the events
// are sent again, one by one). The callback releases the call's context, and with it
// the context's reference to the channel, before it answers: the caller may destroy
// this sink as soon as it has the answers, and gRPC's callback thread must never hold
// the channel's last reference.
//
// Security: the channel is plaintext unless its credentials say otherwise. For a spec,
// DownstreamCredentials builds them from sink.downstream.tls (TLS, optionally mTLS) and
// the bearer token its caller resolved (server/api_keys.h): gRPC call credentials, sent
// as `authorization: Bearer <token>` and only ever over a secure channel. A handshake
// that fails (a plaintext peer, an untrusted or misnamed certificate, a client
// certificate the sink refuses) is a failed RPC like any other: kTransportError, retried;
// its message is gRPC's, which carries no key or token.
//
// Thread-compatible for Deliver (one worker at a time); Cancel() and max_batch() may be
// called from any thread. Cancel() is final: in-flight RPCs are cancelled and every later
// Deliver answers kTransportError at once, without sending.
#ifndef HANDOFF_CONSUMER_SINKS_GRPC_EVENT_SINK_H_
#define HANDOFF_CONSUMER_SINKS_GRPC_EVENT_SINK_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/recycler.h"
#include "consumer/sink.h"
#include "grpcpp/grpcpp.h"
#include "handoff/v1/event_sink.grpc.pb.h"

namespace handoff::consumer {

struct GrpcEventSinkOptions {
  // gRPC target, e.g. "dns:///ledger.svc:8443" or "127.0.0.1:9000". Required.
  std::string target;
  // Deadline of every RPC (Apply or one ApplyBatch chunk).
  absl::Duration deadline = absl::Milliseconds(5000);
  // Use ApplyBatch, in chunks of at most max_batch events (1..kMaxBatchLimit).
  bool batch = false;
  int max_batch = 256;
  // Channel credentials; null means insecure (plaintext).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // With TLS credentials: the name the sink's certificate is checked against (and the
  // SNI) instead of the target's host (GRPC_SSL_TARGET_NAME_OVERRIDE_ARG). Empty: the
  // target's.
  std::string ssl_target_name_override;
  // Cap of the channel's reconnect backoff, so a restarted sink is found again quickly
  // (gRPC's default grows to 120 s).
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
};

// The messages of one ApplyBatch call.
struct BatchCall {
  handoff::v1::ApplyBatchRequest request;
  handoff::v1::ApplyBatchResponse response;
  // The last batch's events' messages, detached by BatchCallPool::Give: Clear() deletes an
  // ApplyRequest's event (a proto3 message field has no presence to keep it by), so they
  // wait here for the next batch's requests (AddEvent).
  std::vector<std::unique_ptr<handoff::v1::EventRow>> spare_events;

  // A new request of this batch, its event a kept message (and its strings' memory)
  // when there is one.
  handoff::v1::ApplyRequest* AddEvent();
};

// BatchCallPool: recycles ApplyBatch calls' messages. Filling a used request reuses its
// events' messages and their strings' memory; a new one took ~10 heap blocks per event,
// and allocating and freeing them was about a third of a FINALIZED delivery thread's
// CPU (bench/HISTORY.md item 83; the events' messages themselves since item 96, kept
// aside by Give before the request is cleared).
//
// Invariants:
//  - Calls handed out by Take() are empty (cleared when given back).
//  - At most `max_calls` calls are held, whatever the number of sinks. A held call keeps
//    the memory of the events it carried (its largest batch's, strings included), so the
//    pool holds at most max_calls sink batches: max_calls x the largest max_batch x the
//    largest event (README.md, "Memory").
//
// Thread-safe.
class BatchCallPool {
 public:
  explicit BatchCallPool(size_t max_calls) : held_(max_calls) {}

  // The pool every GrpcEventSink shares (a delivering source has one call in flight).
  static constexpr size_t kPooledBatchCalls = 4;
  static BatchCallPool& Default();

  // A held call, or a new one.
  std::unique_ptr<BatchCall> Take();
  // Clears `call` (on the calling thread) and keeps it; beyond max_calls the oldest held
  // is freed.
  void Give(std::unique_ptr<BatchCall> call);

  size_t held() const { return held_.held(); }

 private:
  Recycler<BatchCall> held_;
};

class GrpcEventSink final : public ExternalSink {
 public:
  static constexpr int kMaxBatchLimit = 10000;

  // Checks the options and creates the channel (connection is lazy: an unreachable
  // target shows up as kTransportError answers, not here). INVALID_ARGUMENT on bad options.
  static absl::StatusOr<std::unique_ptr<GrpcEventSink>> Create(GrpcEventSinkOptions options);

  // Over an existing channel (tests, shared channels). `options.target` and
  // `credentials` are ignored. REQUIRES: options valid (as Create checks).
  GrpcEventSink(std::shared_ptr<grpc::Channel> channel, GrpcEventSinkOptions options);

  GrpcEventSink(const GrpcEventSink&) = delete;
  GrpcEventSink& operator=(const GrpcEventSink&) = delete;
  ~GrpcEventSink() override;

  std::vector<SinkAnswer> Deliver(absl::string_view source_id,
                                  absl::Span<const Delivery> deliveries) override;
  std::future<std::vector<SinkAnswer>> Send(absl::string_view source_id,
                                            absl::Span<const Delivery> deliveries) override;
  int max_batch() const override;
  void Cancel() override;

  static constexpr size_t kMaxRequestBytes = (4u << 20) - (64u << 10);

 private:
  // The end of the chunk that starts at `from`: at most max_batch() events and, beyond
  // the first, at most kMaxRequestBytes.
  size_t ChunkEnd(absl::string_view source_id, absl::Span<const Delivery> deliveries,
                  size_t from) const;
  // One Apply RPC. Returns false on a transport failure (`answer` says why).
  bool CallApply(const handoff::v1::ApplyRequest& request, SinkAnswer* answer);
  enum class BatchResult {
    kAnswered,       // one outcome per event
    kShort,          // a prefix answered; the rest are kTransportError
    kFailed,         // the RPC failed, or answered more results than events (they may
                     // not line up); all are kTransportError
    kUnimplemented,  // the sink has no ApplyBatch; `answers` untouched
  };
  // One ApplyBatch RPC of `call->request` (its answer in `call->response`); fills one
  // answer per event of the request (except kUnimplemented).
  BatchResult CallApplyBatch(BatchCall* call, std::vector<SinkAnswer>* answers);
  // The answers of a finished ApplyBatch RPC of `call`, as CallApplyBatch returns them
  // (RESOURCE_EXHAUSTED lowers batch_limit_).
  BatchResult BatchAnswers(const grpc::Status& status, const BatchCall& call,
                           std::vector<SinkAnswer>* answers);

  // Registers `ctx` for Cancel(), or returns false if already cancelled.
  bool Register(grpc::ClientContext* ctx);
  void Unregister(grpc::ClientContext* ctx);

  // Constant after construction.
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<handoff::v1::EventSink::Stub> stub_;
  const absl::Duration deadline_;
  const int max_batch_;

  // max_batch_ until an ApplyBatch is answered RESOURCE_EXHAUSTED; only ever lowered.
  std::atomic<int> batch_limit_;
  // Set once ApplyBatch answered UNIMPLEMENTED (or batching is off).
  std::atomic<bool> per_event_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

// The largest PEM file DownstreamCredentials reads.
inline constexpr size_t kMaxPemFileBytes = 1 << 20;

// The channel credentials of a Downstream sink: insecure (plaintext) without
// tls.enabled; else TLS with the roots of tls.ca_file (empty: the system's), the client
// certificate and key of mTLS when named, and, when `bearer_token` is not empty, call
// credentials that send it as `authorization: Bearer <token>`. The files are read now.
// FAILED_PRECONDITION naming the field and the path (never what a file holds) when one
// is missing, unreadable, not a regular file, larger than kMaxPemFileBytes or holds no
// PEM of its kind (an encrypted key included), when the key does not match the
// certificate, or for a token without TLS.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> DownstreamCredentials(
    const handoff::v1::SinkSpec::Downstream& downstream, const std::string& bearer_token);

// The ExternalSink of `spec`: a GrpcEventSink for a Downstream sink, nullptr for local
// rows (or no sink). INVALID_ARGUMENT for a Downstream spec without target or with
// max_batch above GrpcEventSink::kMaxBatchLimit; DownstreamCredentials' errors for its
// tls (and `bearer_token`, the token sink.downstream.token names, resolved by the
// caller). Every error begins "source <id>: ". Defaults: deadline 5000 ms, max_batch 256.
absl::StatusOr<std::unique_ptr<ExternalSink>> MakeExternalSink(
    const handoff::v1::SourceSpec& spec, const std::string& bearer_token = "");

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SINKS_GRPC_EVENT_SINK_H_
