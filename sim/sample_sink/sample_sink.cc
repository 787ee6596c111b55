#include "sim/sample_sink/sample_sink.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "handoff/v1/event_sink.grpc.pb.h"
#include "sim/sample_sink/sample_sink_admin.grpc.pb.h"

namespace handoff::sim {
namespace {

// The one place absl::Status becomes grpc::Status.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Whether `a` equals `b`, in a time that does not depend on where they differ.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

// Thin adapter: EventSink RPCs -> SinkCore::Apply. Handlers run on gRPC's threads.
class SampleSink::EventSinkService final : public handoff::v1::EventSink::Service {
 public:
  EventSinkService(SinkCore* core, std::string bearer_token)
      : core_(core), bearer_token_(std::move(bearer_token)) {}

  grpc::Status Apply(grpc::ServerContext* context, const handoff::v1::ApplyRequest* request,
                     handoff::v1::ApplyResponse* response) override {
    if (!Authorized(*context)) return Unauthenticated();
    const handoff::v1::ApplyRequest* one[] = {request};
    absl::StatusOr<std::vector<handoff::v1::ApplyResponse>> out =
        core_->Apply(one, /*batch=*/false);
    if (!out.ok()) return ToGrpc(out.status());
    if (!out->empty()) *response = std::move(out->front());
    return grpc::Status::OK;
  }

  grpc::Status ApplyBatch(grpc::ServerContext* context,
                          const handoff::v1::ApplyBatchRequest* request,
                          handoff::v1::ApplyBatchResponse* response) override {
    if (!Authorized(*context)) return Unauthenticated();
    std::vector<const handoff::v1::ApplyRequest*> events;
    events.reserve(request->events_size());
    for (const auto& event : request->events()) events.push_back(&event);
    absl::StatusOr<std::vector<handoff::v1::ApplyResponse>> out =
        core_->Apply(events, /*batch=*/true);
    if (!out.ok()) return ToGrpc(out.status());
    for (auto& result : *out) *response->add_results() = std::move(result);
    return grpc::Status::OK;
  }

 private:
  // No token to check, or the call carries `authorization: Bearer <token>`.
  bool Authorized(const grpc::ServerContext& context) const {
    if (bearer_token_.empty()) return true;
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) return false;
    const absl::string_view value(it->second.data(), it->second.size());
    constexpr absl::string_view kBearer = "Bearer ";
    return absl::StartsWith(value, kBearer) &&
           SameSecret(value.substr(kBearer.size()), bearer_token_);
  }

  static grpc::Status Unauthenticated() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "sample sink: bearer token required");
  }

  SinkCore* const core_;
  const std::string bearer_token_;
};

// Thin adapter: SampleSinkAdmin RPCs -> SinkCore.
class SampleSink::AdminService final : public handoff::sim::v1::SampleSinkAdmin::Service {
 public:
  explicit AdminService(SinkCore* core) : core_(core) {}

  grpc::Status SetFaults(grpc::ServerContext*, const handoff::sim::v1::SetFaultsRequest* request,
                         handoff::sim::v1::SetFaultsResponse*) override {
    core_->SetFaults(request->faults());
    return grpc::Status::OK;
  }

  grpc::Status GetFaults(grpc::ServerContext*, const handoff::sim::v1::GetFaultsRequest*,
                         handoff::sim::v1::FaultConfig* response) override {
    *response = core_->faults();
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext*, const handoff::sim::v1::GetStatsRequest*,
                        handoff::sim::v1::Stats* response) override {
    *response = core_->stats();
    return grpc::Status::OK;
  }

  grpc::Status ListRecords(grpc::ServerContext*, const handoff::sim::v1::ListRecordsRequest*,
                           handoff::sim::v1::ListRecordsResponse* response) override {
    absl::StatusOr<std::map<std::string, SinkRecord>> records = core_->Records();
    if (!records.ok()) return ToGrpc(records.status());
    for (const auto& [key, record] : *records) {
      handoff::sim::v1::RecordSummary* summary = response->add_records();
      summary->set_idempotency_key(key);
      summary->set_block_number(record.request.event().block_number());
      summary->set_log_index(record.request.event().log_index());
      summary->set_attempts(record.attempts);
    }
    return grpc::Status::OK;
  }

 private:
  SinkCore* const core_;
};

absl::StatusOr<std::unique_ptr<SampleSink>> SampleSink::Start(Options options) {
  if (options.tls_cert_chain.empty() != options.tls_private_key.empty()) {
    return absl::InvalidArgumentError("sample sink: tls cert and key go together");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert_chain.empty()) {
    return absl::InvalidArgumentError("sample sink: a tls client CA needs a tls cert and key");
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert_chain.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                      : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_key_cert_pairs.push_back({options.tls_private_key, options.tls_cert_chain});
    ssl.pem_root_certs = options.tls_client_ca;
    credentials = grpc::SslServerCredentials(ssl);
  }
  std::unique_ptr<SampleSink> sink(new SampleSink());
  absl::StatusOr<std::unique_ptr<SinkCore>> core = SinkCore::Open(std::move(options.core));
  if (!core.ok()) return core.status();
  sink->core_ = *std::move(core);
  sink->sink_service_ =
      std::make_unique<EventSinkService>(sink->core_.get(), std::move(options.bearer_token));
  sink->admin_service_ = std::make_unique<AdminService>(sink->core_.get());
  sink->host_ = options.host;

  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           credentials, &sink->port_);
  builder.RegisterService(sink->sink_service_.get());
  builder.RegisterService(sink->admin_service_.get());
  sink->server_ = builder.BuildAndStart();
  if (sink->server_ == nullptr || sink->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("sample sink: cannot listen on ", options.host, ":", options.port));
  }
  return sink;
}

SampleSink::~SampleSink() { Stop(); }

std::string SampleSink::target() const { return absl::StrCat(host_, ":", port_); }

void SampleSink::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (core_ != nullptr) core_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
}

}  // namespace handoff::sim
