#include "server/factories.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace handoff::server {

consumer::Factories ProductionFactories() {
  consumer::Factories factories;
  // Wire consumer/provider/'s HttpProvider here.
  factories.provider = [](const handoff::v1::SourceSpec& spec)
      -> absl::StatusOr<std::unique_ptr<consumer::Provider>> {
    return absl::UnimplementedError(absl::StrCat(
        "source ", spec.id(), ": this handoffd build links no provider adapter"));
  };
  // Wire consumer/sinks/'s EventSink client here.
  factories.external_sink = [](const handoff::v1::SourceSpec& spec)
      -> absl::StatusOr<std::unique_ptr<consumer::ExternalSink>> {
    if (!spec.sink().has_downstream()) return std::unique_ptr<consumer::ExternalSink>();
    return absl::UnimplementedError(absl::StrCat(
        "source ", spec.id(), ": this handoffd build links no EventSink client"));
  };
  return factories;
}

}  // namespace handoff::server

namespace handoff::server {

absl::StatusOr<std::unique_ptr<consumer::SourceManager>> CreateProductionSourceManager(
    consumer::SourceManagerOptions options) {
  return consumer::SourceManager::Create(std::move(options));
}

}  // namespace handoff::server
