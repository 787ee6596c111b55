#include "server/sources_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"

namespace handoff::server {
namespace {

using handoff::v1::SourceSpec;

// Keeps the first syntax error with its position.
class FirstErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

}  // namespace

absl::StatusOr<handoff::v1::SourcesConfig> ParseSourcesConfig(const std::string& text) {
  handoff::v1::SourcesConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat("sources_config: ", errors.error()));
  }
  return config;
}

absl::StatusOr<handoff::v1::SourcesConfig> LoadSourcesConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("sources_config: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseSourcesConfig(text.str());
}

std::vector<std::string> ChangedSpecFields(const SourceSpec& a, const SourceSpec& b) {
  std::vector<std::string> changed;
  const google::protobuf::Descriptor* descriptor = SourceSpec::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    google::protobuf::util::MessageDifferencer differencer;
    // Compare only this field: ignore every other one.
    for (int j = 0; j < descriptor->field_count(); ++j) {
      if (j != i) differencer.IgnoreField(descriptor->field(j));
    }
    if (!differencer.Compare(a, b)) changed.push_back(field->name());
  }
  return changed;
}

bool IsSafeSpecChange(const std::string& field) {
  return field == "transport" || field == "page_limit" || field == "api_key" ||
         field == "failure_policy";
}

absl::Status ApplySourcesConfig(const handoff::v1::SourcesConfig& config,
                                consumer::SourceManager* manager, Logger* logger) {
  for (int i = 0; i < config.sources_size(); ++i) {
    const handoff::v1::DeclaredSource& declared = config.sources(i);
    const std::string& id = declared.spec().id();
    const std::string where = absl::StrCat("sources_config: sources[", i, "] (id \"", id, "\")");

    handoff::v1::CreateSourceRequest create;
    *create.mutable_spec() = declared.spec();
    create.set_start(declared.start());
    absl::StatusOr<handoff::v1::Source> created = manager->CreateSource(create);
    if (created.ok()) {
      logger->Info("declared source in place", {{"source_id", id}});
    } else if (created.status().code() == absl::StatusCode::kAlreadyExists) {
      absl::StatusOr<handoff::v1::Source> stored = manager->GetSource(id);
      if (!stored.ok()) {
        return absl::Status(stored.status().code(),
                            absl::StrCat(where, ": ", stored.status().message()));
      }
      const std::vector<std::string> changed = ChangedSpecFields(stored->spec(), declared.spec());
      std::vector<std::string> unsafe;
      for (const std::string& field : changed) {
        if (!IsSafeSpecChange(field)) unsafe.push_back(field);
      }
      if (!unsafe.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            where, ": the declared spec changes ", absl::StrJoin(unsafe, ", "),
            " of an existing source; identity, start and sink changes are refused (delete "
            "and recreate the source, or RebuildSource, then update the file)"));
      }
      logger->Warning("declared source differs only in safe fields; keeping the stored spec "
                      "until the core can update a spec in place",
                      {{"source_id", id}, {"fields", absl::StrJoin(changed, ",")}});
    } else {
      return absl::Status(created.status().code(),
                          absl::StrCat(where, ": ", created.status().message()));
    }
    if (declared.start()) {
      absl::StatusOr<handoff::v1::Source> started = manager->StartSource(id);
      if (!started.ok()) {
        // The source exists as declared; a refusal to start (e.g. a halted source whose
        // identity changed) is the operator's to resolve through the admin API.
        logger->Error("declared source did not start",
                      {{"source_id", id},
                       {"code", absl::StatusCodeToString(started.status().code())},
                       {"error", started.status().message()}});
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace handoff::server
