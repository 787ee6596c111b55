#include "consumer/spec_validation.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "consumer/outcome_policy.h"
#include "google/protobuf/util/message_differencer.h"

namespace handoff::consumer {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool IsPrintable(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

// A reference to a secret (SecretRef): a variable or a file, never the secret itself.
absl::Status ValidateSecretRef(const handoff::v1::SecretRef& ref, absl::string_view field) {
  switch (ref.source_case()) {
    case handoff::v1::SecretRef::kEnv:
      if (ref.env().empty() || !IsPrintable(ref.env())) {
        return Invalid(absl::StrCat(field, ".env"), "must name an environment variable");
      }
      return absl::OkStatus();
    case handoff::v1::SecretRef::kFile:
      if (ref.file().empty() || !IsPrintable(ref.file())) {
        return Invalid(absl::StrCat(field, ".file"), "must name a file");
      }
      return absl::OkStatus();
    default:
      return Invalid(field, "set env or file (never the secret itself)");
  }
}

// A downstream sink's tls and token. An empty tls message is dropped, so that it and an
// absent one are the same stored spec.
absl::Status ValidateDownstreamSecurity(handoff::v1::SinkSpec::Downstream* d) {
  constexpr absl::string_view kTls = "spec.sink.downstream.tls";
  const handoff::v1::SinkSpec::Downstream::Tls& tls = d->tls();
  const std::pair<const char*, const std::string*> fields[] = {
      {"ca_file", &tls.ca_file()},
      {"client_cert_file", &tls.client_cert_file()},
      {"client_key_file", &tls.client_key_file()},
      {"server_name_override", &tls.server_name_override()}};
  for (const auto& [name, value] : fields) {
    if (value->size() > 4096 || !IsPrintable(*value)) {
      return Invalid(absl::StrCat(kTls, ".", name), "must be printable, at most 4096 bytes");
    }
    if (!value->empty() && !tls.enabled()) {
      return Invalid(absl::StrCat(kTls, ".", name),
                     "set while tls.enabled is false: set tls.enabled, or clear it");
    }
  }
  const std::string& host = tls.server_name_override();
  if (host.size() > 253 || absl::StrContains(host, " ") || absl::StrContains(host, "/")) {
    return Invalid(absl::StrCat(kTls, ".server_name_override"), "must be a host name");
  }
  if (tls.client_cert_file().empty() != tls.client_key_file().empty()) {
    return Invalid(absl::StrCat(kTls, ".client_cert_file/client_key_file"),
                   "set both (mTLS) or neither");
  }
  if (d->has_token()) {
    absl::Status s = ValidateSecretRef(d->token(), "spec.sink.downstream.token");
    if (!s.ok()) return s;
    if (!tls.enabled()) {
      return Invalid("spec.sink.downstream.token",
                     "requires tls.enabled (a bearer token is never sent in plaintext)");
    }
  }
  if (d->has_tls() && !tls.enabled()) d->clear_tls();  // nothing else is set: see above
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSourceId(absl::string_view id, absl::string_view field) {
  if (id.empty()) return Invalid(field, "required");
  if (id.size() > 63) return Invalid(field, "at most 63 characters");
  for (size_t i = 0; i < id.size(); ++i) {
    char c = id[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && c == '-');
    if (!ok) return Invalid(field, "must match [a-z0-9][a-z0-9-]{0,62}");
  }
  return absl::OkStatus();
}

absl::StatusOr<handoff::v1::SourceSpec> NormalizeSpec(const handoff::v1::SourceSpec& in) {
  handoff::v1::SourceSpec spec = in;
  absl::Status s = ValidateSourceId(spec.id(), "spec.id");
  if (!s.ok()) return s;
  const std::string& url = spec.provider_url();
  if (url.empty()) return Invalid("spec.provider_url", "required");
  if (!(absl::StartsWith(url, "http://") || absl::StartsWith(url, "https://")) ||
      url.size() > 2048 || !IsPrintable(url) || absl::StrContains(url, " ") ||
      absl::StrContains(url, "?") || absl::StrContains(url, "#")) {
    return Invalid("spec.provider_url", "must be an http:// or https:// base URL without query");
  }
  // The spec is stored and returned by the admin API and logged by id; a credential in the
  // URL would be shown with it. The URL itself is never echoed here, for the same reason.
  absl::string_view authority = url;
  authority.remove_prefix(authority.find("://") + 3);
  authority = authority.substr(0, authority.find('/'));
  if (absl::StrContains(authority, "@")) {
    return Invalid("spec.provider_url",
                   "must not carry credentials (user:password@); name the key in spec.api_key");
  }
  if (authority.empty() || authority[0] == ':') {
    return Invalid("spec.provider_url", "must name a host");
  }
  while (!spec.provider_url().empty() && spec.provider_url().back() == '/') {
    spec.mutable_provider_url()->pop_back();
  }
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string*>{"spec.chain", &spec.chain()},
        {"spec.source", &spec.source()},
        {"spec.filter", &spec.filter()}}) {
    if (value->size() > 1024 || !IsPrintable(*value)) {
      return Invalid(name, "must be printable and at most 1024 bytes");
    }
  }
  if (spec.chain().empty()) return Invalid("spec.chain", "required");
  if (spec.source().empty()) return Invalid("spec.source", "required");
  if (spec.filter().empty()) return Invalid("spec.filter", "required");
  switch (spec.transport()) {
    case handoff::v1::TRANSPORT_POLL:
    case handoff::v1::TRANSPORT_SSE:
      break;
    case handoff::v1::TRANSPORT_UNSPECIFIED:
      return Invalid("spec.transport", "required (TRANSPORT_POLL or TRANSPORT_SSE)");
    default:
      return Invalid("spec.transport", absl::StrCat("unknown value ", spec.transport()));
  }
  switch (spec.start().position_case()) {
    case handoff::v1::StartPosition::kBlock:
      if (spec.start().block() > static_cast<uint64_t>(INT64_MAX)) {
        return Invalid("spec.start.block", "at most 2^63-1");
      }
      break;
    case handoff::v1::StartPosition::kLatest:
      if (!spec.start().latest()) return Invalid("spec.start.latest", "must be true when set");
      break;
    default:
      return Invalid("spec.start", "required: a numeric block or latest");
  }
  if (spec.page_limit() == 0) spec.set_page_limit(1000);
  if (spec.page_limit() > 1000) return Invalid("spec.page_limit", "at most 1000");
  if (spec.has_api_key()) {
    s = ValidateSecretRef(spec.api_key(), "spec.api_key");
    if (!s.ok()) return s;
  }
  handoff::v1::SinkSpec* sink = spec.mutable_sink();
  switch (sink->kind_case()) {
    case handoff::v1::SinkSpec::KIND_NOT_SET:
      sink->mutable_local_rows();
      break;
    case handoff::v1::SinkSpec::kLocalRows:
      break;
    case handoff::v1::SinkSpec::kDownstream: {
      handoff::v1::SinkSpec::Downstream* d = sink->mutable_downstream();
      if (d->target().empty() || !IsPrintable(d->target())) {
        return Invalid("spec.sink.downstream.target", "required (a gRPC target)");
      }
      if (d->deadline_ms() == 0) d->set_deadline_ms(5000);
      if (d->deadline_ms() > 600000) {
        return Invalid("spec.sink.downstream.deadline_ms", "at most 600000");
      }
      if (d->max_batch() == 0) d->set_max_batch(256);
      if (d->max_batch() > 10000) return Invalid("spec.sink.downstream.max_batch", "at most 10000");
      s = ValidateDownstreamSecurity(d);
      if (!s.ok()) return s;
      break;
    }
  }
  switch (sink->gate()) {
    case handoff::v1::DELIVERY_GATE_UNSPECIFIED:
      // The provider contract gates effects outside the service on the highest finalized
      // mark (an event above it can still be reorged away): a downstream sink gets that
      // unless its spec asks for less. The gate means nothing for local rows.
      sink->set_gate(sink->has_downstream() ? handoff::v1::DELIVERY_GATE_FINALIZED
                                            : handoff::v1::DELIVERY_GATE_IMMEDIATE);
      break;
    case handoff::v1::DELIVERY_GATE_IMMEDIATE:
    case handoff::v1::DELIVERY_GATE_SAFE:
    case handoff::v1::DELIVERY_GATE_FINALIZED:
      break;
    default:
      return Invalid("spec.sink.gate", absl::StrCat("unknown value ", sink->gate()));
  }
  const handoff::v1::FailurePolicy& p = spec.failure_policy();
  if (p.max_attempts() > 1000) return Invalid("spec.failure_policy.max_attempts", "at most 1000");
  // Both bound a wait: the max is raised to the initial one when below it.
  if (p.initial_backoff_ms() > 3600000) {
    return Invalid("spec.failure_policy.initial_backoff_ms", "at most 3600000");
  }
  if (p.max_backoff_ms() > 3600000) {
    return Invalid("spec.failure_policy.max_backoff_ms", "at most 3600000");
  }
  if (p.on_rejection() != handoff::v1::REJECTION_POLICY_UNSPECIFIED &&
      p.on_rejection() != handoff::v1::REJECTION_POLICY_HOLD &&
      p.on_rejection() != handoff::v1::REJECTION_POLICY_QUARANTINE) {
    return Invalid("spec.failure_policy.on_rejection", absl::StrCat("unknown value ",
                                                                    p.on_rejection()));
  }
  *spec.mutable_failure_policy() = NormalizedPolicy(p);
  return spec;
}

std::vector<std::string> UnsafeSpecChanges(const handoff::v1::SourceSpec& stored,
                                           const handoff::v1::SourceSpec& updated) {
  handoff::v1::SourceSpec a = stored, b = updated;
  for (handoff::v1::SourceSpec* s : {&a, &b}) {
    s->clear_transport();
    s->clear_page_limit();
    s->clear_api_key();
    s->clear_failure_policy();
    if (s->sink().has_downstream()) {
      s->mutable_sink()->mutable_downstream()->clear_deadline_ms();
      s->mutable_sink()->mutable_downstream()->clear_batch();
      s->mutable_sink()->mutable_downstream()->clear_max_batch();
      s->mutable_sink()->mutable_downstream()->clear_tls();
      s->mutable_sink()->mutable_downstream()->clear_token();
    }
  }
  std::vector<std::string> changed;
  const google::protobuf::Descriptor* descriptor = handoff::v1::SourceSpec::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    google::protobuf::util::MessageDifferencer differencer;
    for (int j = 0; j < descriptor->field_count(); ++j) {
      if (j != i) differencer.IgnoreField(descriptor->field(j));
    }
    if (!differencer.Compare(a, b)) changed.push_back(descriptor->field(i)->name());
  }
  return changed;
}

absl::StatusOr<int> PageSize(int requested, int default_size, int max_size,
                             absl::string_view field) {
  if (requested == 0) return default_size;
  if (requested < 0) return Invalid(field, "must not be negative");
  if (requested > max_size) return Invalid(field, absl::StrCat("at most ", max_size));
  return requested;
}

}  // namespace handoff::consumer
