#include "consumer/sinks/grpc_event_sink.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace handoff::consumer {
namespace {

using handoff::v1::ApplyRequest;
using handoff::v1::ApplyResponse;

SinkAnswer TransportError(std::string message) {
  SinkAnswer answer;
  answer.kind = SinkAnswer::Kind::kTransportError;
  answer.message = std::move(message);
  return answer;
}

std::string Describe(absl::string_view rpc, const grpc::Status& s) {
  // grpc::StatusCode and absl::StatusCode share their numbering.
  return absl::StrCat(rpc, ": ",
                      absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())), ": ",
                      s.error_message());
}

// The sink's stated outcome for one event, as a SinkAnswer.
SinkAnswer ToAnswer(const ApplyResponse& response) {
  SinkAnswer answer;
  answer.message = response.message();
  switch (response.outcome()) {
    case handoff::v1::APPLY_OUTCOME_APPLIED:
      answer.kind = SinkAnswer::Kind::kApplied;
      break;
    case handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED:
      answer.kind = SinkAnswer::Kind::kAlreadyApplied;
      break;
    case handoff::v1::APPLY_OUTCOME_IGNORED:
      answer.kind = SinkAnswer::Kind::kIgnored;
      break;
    case handoff::v1::APPLY_OUTCOME_RETRY_LATER:
      answer.kind = SinkAnswer::Kind::kRetryLater;
      break;
    case handoff::v1::APPLY_OUTCOME_REJECTED:
      answer.kind = SinkAnswer::Kind::kRejected;
      break;
    case handoff::v1::APPLY_OUTCOME_NEEDS_REVIEW:
      answer.kind = SinkAnswer::Kind::kNeedsReview;
      break;
    default:
      // Not an outcome we know: never a receipt.
      return TransportError(absl::StrCat("sink answered unknown outcome ",
                                         static_cast<int>(response.outcome()), ": ",
                                         response.message()));
  }
  if (response.retry_after_ms() > 0) {
    answer.retry_after = absl::Milliseconds(response.retry_after_ms());
  }
  return answer;
}

// What `delivery` adds to an ApplyBatch request, within a few bytes of its encoding.
size_t RequestBytes(absl::string_view source_id, const Delivery& delivery) {
  constexpr size_t kFraming = 24;  // tags and lengths of the request and its fields
  return delivery.row->ByteSizeLong() + delivery.idempotency_key.size() + source_id.size() +
         kFraming;
}

void Fill(absl::string_view source_id, const Delivery& delivery, ApplyRequest* request) {
  request->mutable_source_id()->assign(source_id.data(), source_id.size());
  request->set_idempotency_key(delivery.idempotency_key);
  *request->mutable_event() = *delivery.row;
  request->set_finality(delivery.finality);
}

enum class PemKind { kCertificates, kPrivateKey };

absl::Status Unusable(absl::string_view field, absl::string_view path, absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(field, ": ", path, " ", why));
}

// OpenSSL's memory BIO over `pem`, freed with it.
using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
Bio ReadOnlyBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
}

// Refuses any passphrase: gRPC takes unencrypted keys only, and OpenSSL's default would
// prompt on the terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

// The file at `path`, which must hold PEM of `kind`; errors name `field` and the path,
// never the contents. OpenSSL's error queue (this thread's) is left empty.
absl::StatusOr<std::string> ReadPem(absl::string_view field, const std::string& path,
                                    PemKind kind) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return Unusable(field, path, absl::StrCat("cannot be read: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return Unusable(field, path, "is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxPemFileBytes) {
    return Unusable(field, path, "is larger than 1 MiB");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    return Unusable(field, path, absl::StrCat("cannot be read: ", std::strerror(errno)));
  }
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Unusable(field, path, "cannot be read");
  Bio bio = ReadOnlyBio(pem);
  bool found = false;
  if (bio != nullptr && kind == PemKind::kCertificates) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr);
    found = cert != nullptr;
    X509_free(cert);
  } else if (bio != nullptr) {
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr);
    found = key != nullptr;
    EVP_PKEY_free(key);
  }
  ERR_clear_error();
  if (!found && kind == PemKind::kCertificates) {
    return Unusable(field, path, "holds no PEM certificate");
  }
  if (!found) {
    return Unusable(field, path,
                    absl::StrContains(pem, "-----BEGIN ENCRYPTED PRIVATE KEY-----") ||
                            absl::StrContains(pem, "Proc-Type: 4,ENCRYPTED")
                        ? "holds an encrypted private key (gRPC takes no passphrase)"
                        : "holds no PEM private key");
  }
  return pem;
}

// The first certificate of `cert_chain` is the one of `private_key`.
absl::Status CheckKeyPair(const std::string& cert_chain, const std::string& private_key) {
  Bio cert_bio = ReadOnlyBio(cert_chain), key_bio = ReadOnlyBio(private_key);
  X509* cert = cert_bio == nullptr
                   ? nullptr
                   : PEM_read_bio_X509(cert_bio.get(), nullptr, NoPassphrase, nullptr);
  EVP_PKEY* key = key_bio == nullptr
                      ? nullptr
                      : PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr);
  const bool match = cert != nullptr && key != nullptr && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  if (!match) {
    return absl::FailedPreconditionError(
        "sink.downstream.tls.client_key_file: the key does not match the certificate of "
        "client_cert_file");
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const GrpcEventSinkOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("downstream sink: no target");
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("downstream sink: deadline must be positive");
  }
  if (options.max_batch < 1 || options.max_batch > GrpcEventSink::kMaxBatchLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("downstream sink: max_batch must be in 1..", GrpcEventSink::kMaxBatchLimit));
  }
  return absl::OkStatus();
}

}  // namespace

BatchCallPool& BatchCallPool::Default() {
  static BatchCallPool* pool = new BatchCallPool(kPooledBatchCalls);
  return *pool;
}

std::unique_ptr<BatchCall> BatchCallPool::Take() {
  std::unique_ptr<BatchCall> call = held_.Take();
  return call != nullptr ? std::move(call) : std::make_unique<BatchCall>();
}

ApplyRequest* BatchCall::AddEvent() {
  ApplyRequest* event = request.add_events();
  if (!spare_events.empty()) {
    event->set_allocated_event(spare_events.back().release());
    spare_events.pop_back();
  }
  return event;
}

void BatchCallPool::Give(std::unique_ptr<BatchCall> call) {
  if (call == nullptr) return;
  for (ApplyRequest& event : *call->request.mutable_events()) {
    if (event.has_event()) call->spare_events.emplace_back(event.release_event());
  }
  call->request.Clear();  // keeps the (now event-less) requests and their strings' memory
  call->response.Clear();
  held_.Give(std::move(call));
}

absl::StatusOr<std::unique_ptr<GrpcEventSink>> GrpcEventSink::Create(GrpcEventSinkOptions options) {
  absl::Status s = CheckOptions(options);
  if (!s.ok()) return s;
  grpc::ChannelArguments args;
  const int max_backoff_ms =
      std::max<int>(1, static_cast<int>(absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, max_backoff_ms));
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also the connect timeout (default 20 s),
  // and a short one fails every connection slower than it (TLS, remote sinks).
  if (!options.ssl_target_name_override.empty()) {
    // The name the sink's certificate is checked against, and the SNI.
    args.SetSslTargetNameOverride(options.ssl_target_name_override);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, credentials, args);
  return std::make_unique<GrpcEventSink>(std::move(channel), std::move(options));
}

GrpcEventSink::GrpcEventSink(std::shared_ptr<grpc::Channel> channel, GrpcEventSinkOptions options)
    : channel_(std::move(channel)),
      stub_(handoff::v1::EventSink::NewStub(channel_)),
      deadline_(options.deadline),
      max_batch_(std::clamp(options.max_batch, 1, kMaxBatchLimit)),
      batch_limit_(max_batch_),
      per_event_(!options.batch) {}

GrpcEventSink::~GrpcEventSink() = default;

int GrpcEventSink::max_batch() const { return per_event_.load() ? 1 : batch_limit_.load(); }

size_t GrpcEventSink::ChunkEnd(absl::string_view source_id, absl::Span<const Delivery> deliveries,
                               size_t from) const {
  const size_t limit = static_cast<size_t>(batch_limit_.load());
  size_t end = from, bytes = 0;
  while (end < deliveries.size() && end - from < limit) {
    bytes += RequestBytes(source_id, deliveries[end]);
    if (end > from && bytes > kMaxRequestBytes) break;  // one event always goes
    ++end;
  }
  return end;
}

void GrpcEventSink::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
}

bool GrpcEventSink::Register(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  in_flight_.insert(ctx);
  return true;
}

void GrpcEventSink::Unregister(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(ctx);
}

std::vector<SinkAnswer> GrpcEventSink::Deliver(absl::string_view source_id,
                                               absl::Span<const Delivery> deliveries) {
  std::vector<SinkAnswer> answers(deliveries.size());
  for (const Delivery& d : deliveries) {
    if (d.row == nullptr) {
      for (SinkAnswer& a : answers) a = TransportError("delivery without an event row");
      return answers;
    }
  }
  // Answers [from, end) as not sent, after a transport failure at an earlier event.
  auto not_sent = [&](size_t from, const std::string& why) {
    for (size_t j = from; j < answers.size(); ++j) {
      answers[j] = TransportError(absl::StrCat("not sent: an earlier call failed (", why, ")"));
    }
  };
  size_t i = 0;
  while (i < deliveries.size()) {
    if (!per_event_.load()) {
      const size_t end = ChunkEnd(source_id, deliveries, i);
      std::unique_ptr<BatchCall> call = BatchCallPool::Default().Take();
      for (size_t j = i; j < end; ++j) Fill(source_id, deliveries[j], call->AddEvent());
      std::vector<SinkAnswer> chunk;
      const BatchResult result = CallApplyBatch(call.get(), &chunk);
      BatchCallPool::Default().Give(std::move(call));
      if (result == BatchResult::kUnimplemented) {
        per_event_.store(true);  // re-send this chunk one by one
        continue;
      }
      std::move(chunk.begin(), chunk.end(), answers.begin() + i);
      if (result == BatchResult::kFailed) {
        not_sent(end, answers[i].message);
        return answers;
      }
      if (result == BatchResult::kShort) {
        // The sink stopped early: later events must not overtake the unanswered ones.
        not_sent(end, "short ApplyBatch response");
        return answers;
      }
      i = end;
    } else {
      ApplyRequest request;
      Fill(source_id, deliveries[i], &request);
      if (!CallApply(request, &answers[i])) {
        not_sent(i + 1, answers[i].message);
        return answers;
      }
      ++i;
    }
  }
  return answers;
}

std::future<std::vector<SinkAnswer>> GrpcEventSink::Send(absl::string_view source_id,
                                                         absl::Span<const Delivery> deliveries) {
  const bool one_batch = !per_event_.load() && !deliveries.empty() &&
                         std::all_of(deliveries.begin(), deliveries.end(),
                                     [](const Delivery& d) { return d.row != nullptr; }) &&
                         ChunkEnd(source_id, deliveries, 0) == deliveries.size();
  if (!one_batch) return ExternalSink::Send(source_id, deliveries);
  // Lives until the RPC's callback, which frees it.
  struct InFlight {
    std::unique_ptr<BatchCall> call;
    grpc::ClientContext ctx;
    std::promise<std::vector<SinkAnswer>> answers;
  };
  auto flight = std::make_unique<InFlight>();
  std::future<std::vector<SinkAnswer>> answers = flight->answers.get_future();
  flight->call = BatchCallPool::Default().Take();
  for (const Delivery& d : deliveries) Fill(source_id, d, flight->call->AddEvent());
  flight->ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  if (!Register(&flight->ctx)) {
    BatchCallPool::Default().Give(std::move(flight->call));
    flight->answers.set_value(
        std::vector<SinkAnswer>(deliveries.size(), TransportError("sink cancelled")));
    return answers;
  }
  InFlight* f = flight.release();
  stub_->async()->ApplyBatch(
      &f->ctx, &f->call->request, &f->call->response, [this, f](grpc::Status status) {
        std::unique_ptr<InFlight> done(f);
        Unregister(&done->ctx);
        std::vector<SinkAnswer> out;
        if (BatchAnswers(status, *done->call, &out) == BatchResult::kUnimplemented) {
          per_event_.store(true);  // `out` stays empty: the events are sent again
        }
        BatchCallPool::Default().Give(std::move(done->call));
        // The context holds a reference to the channel. It is released here, while this
        // sink still holds its own: were the caller to destroy the sink first, this
        // callback would drop the channel's last reference on the thread that runs the
        // channel's callbacks, and gRPC would release its callback queue under itself.
        std::promise<std::vector<SinkAnswer>> answers = std::move(done->answers);
        done.reset();
        // Last: the waiting caller may destroy this sink once it has the answers.
        answers.set_value(std::move(out));
      });
  return answers;
}

bool GrpcEventSink::CallApply(const ApplyRequest& request, SinkAnswer* answer) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  if (!Register(&ctx)) {
    *answer = TransportError("sink cancelled");
    return false;
  }
  ApplyResponse response;
  const grpc::Status s = stub_->Apply(&ctx, request, &response);
  Unregister(&ctx);
  if (!s.ok()) {
    *answer = TransportError(Describe("Apply", s));
    return false;
  }
  *answer = ToAnswer(response);
  return true;
}

GrpcEventSink::BatchResult GrpcEventSink::CallApplyBatch(BatchCall* call,
                                                         std::vector<SinkAnswer>* answers) {
  const handoff::v1::ApplyBatchRequest& request = call->request;
  handoff::v1::ApplyBatchResponse& response = call->response;
  const size_t n = request.events_size();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  if (!Register(&ctx)) {
    answers->assign(n, TransportError("sink cancelled"));
    return BatchResult::kFailed;
  }
  const grpc::Status s = stub_->ApplyBatch(&ctx, request, &response);
  Unregister(&ctx);
  return BatchAnswers(s, *call, answers);
}

GrpcEventSink::BatchResult GrpcEventSink::BatchAnswers(const grpc::Status& s,
                                                       const BatchCall& call,
                                                       std::vector<SinkAnswer>* answers) {
  const handoff::v1::ApplyBatchResponse& response = call.response;
  const size_t n = call.request.events_size();
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return BatchResult::kUnimplemented;
  if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && n > 1) {
    // Most often the request was larger than the sink takes (its max receive size): the
    // same batch would fail forever, so the retries go in halves, and stay there.
    int limit = batch_limit_.load();
    const int half = static_cast<int>(n / 2);
    while (half < limit && !batch_limit_.compare_exchange_weak(limit, half)) {
    }
  }
  if (!s.ok()) {
    answers->assign(n, TransportError(Describe("ApplyBatch", s)));
    return BatchResult::kFailed;
  }
  const size_t results = static_cast<size_t>(response.results_size());
  if (results > n) {
    // Results carry no key: a reply longer than the request may be shifted against the
    // events (another batch's, a duplicate), so none of its outcomes can be taken as an
    // event's. All are retried as a transport failure, which uses no attempt.
    answers->assign(n, TransportError(absl::StrCat("ApplyBatch answered ", results,
                                                   " results for ", n, " events")));
    return BatchResult::kFailed;
  }
  answers->clear();
  answers->reserve(n);
  for (size_t j = 0; j < n; ++j) {
    if (j < results) {
      answers->push_back(ToAnswer(response.results(j)));
    } else {
      answers->push_back(TransportError(
          absl::StrCat("missing from the ApplyBatch response (", results, " of ", n, ")")));
    }
  }
  return results < n ? BatchResult::kShort : BatchResult::kAnswered;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> DownstreamCredentials(
    const handoff::v1::SinkSpec::Downstream& d, const std::string& bearer_token) {
  const handoff::v1::SinkSpec::Downstream::Tls& tls = d.tls();
  if (!tls.enabled()) {
    if (!bearer_token.empty()) {
      return absl::FailedPreconditionError(
          "sink.downstream.token: requires tls.enabled (a bearer token is never sent in "
          "plaintext)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls.ca_file().empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem("sink.downstream.tls.ca_file", tls.ca_file(),
                                                 PemKind::kCertificates));
  }
  if (!tls.client_cert_file().empty() || !tls.client_key_file().empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                     ReadPem("sink.downstream.tls.client_cert_file", tls.client_cert_file(),
                             PemKind::kCertificates));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPem("sink.downstream.tls.client_key_file", tls.client_key_file(),
                             PemKind::kPrivateKey));
    RETURN_IF_ERROR(CheckKeyPair(ssl.pem_cert_chain, ssl.pem_private_key));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!bearer_token.empty()) {
    // Call credentials: gRPC attaches them to every call, and refuses to on a channel
    // below privacy and integrity.
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::AccessTokenCredentials(bearer_token));
  }
  if (credentials == nullptr) {
    return absl::FailedPreconditionError("sink.downstream.tls: gRPC refused the credentials");
  }
  return credentials;
}

absl::StatusOr<std::unique_ptr<ExternalSink>> MakeExternalSink(
    const handoff::v1::SourceSpec& spec, const std::string& bearer_token) {
  if (spec.sink().kind_case() != handoff::v1::SinkSpec::kDownstream) {
    return std::unique_ptr<ExternalSink>();  // local rows: no external effect
  }
  const handoff::v1::SinkSpec::Downstream& d = spec.sink().downstream();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      DownstreamCredentials(d, bearer_token);
  if (!credentials.ok()) {
    return absl::Status(credentials.status().code(),
                        absl::StrCat("source ", spec.id(), ": ", credentials.status().message()));
  }
  GrpcEventSinkOptions options;
  options.target = d.target();
  if (d.deadline_ms() > 0) options.deadline = absl::Milliseconds(d.deadline_ms());
  options.batch = d.batch();
  if (d.max_batch() > 0) {
    options.max_batch =
        static_cast<int>(std::min<uint32_t>(d.max_batch(), GrpcEventSink::kMaxBatchLimit + 1));
  }
  options.credentials = *std::move(credentials);
  if (d.tls().enabled()) options.ssl_target_name_override = d.tls().server_name_override();
  absl::StatusOr<std::unique_ptr<GrpcEventSink>> sink = GrpcEventSink::Create(std::move(options));
  if (!sink.ok()) {
    return absl::Status(sink.status().code(),
                        absl::StrCat("source ", spec.id(), ": ", sink.status().message()));
  }
  return std::unique_ptr<ExternalSink>(*std::move(sink));
}

}  // namespace handoff::consumer
