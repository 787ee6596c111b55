#include "server/sources_config.h"

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
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

// The names of `type`'s schema (message, field and enum value names), recursively.
void AddSchemaNames(const google::protobuf::Descriptor* type,
                    absl::flat_hash_set<std::string>* names) {
  if (!names->insert(type->full_name()).second) return;
  names->insert(type->name());
  for (int i = 0; i < type->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type->field(i);
    names->insert(field->name());
    if (field->message_type() != nullptr) AddSchemaNames(field->message_type(), names);
    if (field->enum_type() != nullptr) {
      for (int v = 0; v < field->enum_type()->value_count(); ++v) {
        names->insert(field->enum_type()->value(v)->name());
      }
    }
  }
}

bool IsWordChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.'; }

// The parser's message quotes the text it stopped at, which may be a secret written
// where it does not belong (`api_key: "sk_live_..."`). Every word of the message that
// comes from `text` and is not a name of the schema is replaced by "...".
std::string RedactConfigWords(absl::string_view message, absl::string_view text) {
  static const absl::flat_hash_set<std::string>* const kSchema = [] {
    auto* names = new absl::flat_hash_set<std::string>();
    AddSchemaNames(handoff::v1::SourcesConfig::descriptor(), names);
    return names;
  }();
  std::string out;
  for (size_t i = 0; i < message.size();) {
    if (!IsWordChar(message[i])) {
      out.push_back(message[i++]);
      continue;
    }
    size_t end = i;
    while (end < message.size() && IsWordChar(message[end])) ++end;
    const absl::string_view word = message.substr(i, end - i);
    const bool from_text = text.find(word) != absl::string_view::npos;
    out.append(from_text && !kSchema->contains(word) ? "..." : std::string(word));
    i = end;
  }
  return out;
}

}  // namespace

absl::StatusOr<handoff::v1::SourcesConfig> ParseSourcesConfig(const std::string& text) {
  handoff::v1::SourcesConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sources_config: ", RedactConfigWords(errors.error(), text)));
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

absl::Status ApplySourcesConfig(const handoff::v1::SourcesConfig& config,
                                consumer::SourceManager* manager, Logger* logger) {
  for (int i = 0; i < config.sources_size(); ++i) {
    const handoff::v1::DeclaredSource& declared = config.sources(i);
    const std::string& id = declared.spec().id();
    const std::string where = absl::StrCat("sources_config: sources[", i, "] (id \"", id, "\")");

    // `start` applies to a source this file creates. One that exists keeps its stored
    // desired_running: the operator's StartSource/StopSource since it was created wins
    // over the file at every start (a source stopped on purpose stays stopped).
    absl::StatusOr<handoff::v1::Source> existing = manager->GetSource(id);
    const bool exists = existing.ok();
    handoff::v1::CreateSourceRequest create;
    *create.mutable_spec() = declared.spec();
    create.set_start(declared.start() && !exists);
    absl::StatusOr<handoff::v1::Source> created = manager->CreateSource(create);
    if (exists && declared.start() && !existing->desired_running()) {
      logger->Info("declared source stays stopped: `start` applies only when the file "
                   "creates a source; one that exists keeps its StartSource/StopSource state",
                   {{"source_id", id}});
    }
    if (created.ok()) {
      logger->Info("declared source in place", {{"source_id", id}});
    } else if (created.status().code() == absl::StatusCode::kAlreadyExists) {
      // A safe change (transport, page size, key, failure policy, sink deadline and
      // batching) is applied in place; anything else is refused, naming the fields.
      absl::StatusOr<handoff::v1::Source> updated = manager->UpdateSource(declared.spec());
      if (!updated.ok()) {
        return absl::Status(updated.status().code(),
                            absl::StrCat(where, ": ", updated.status().message()));
      }
      logger->Info("declared source in place (spec updated if it changed safely)",
                   {{"source_id", id}});
      if (updated->progress().state() == handoff::v1::SOURCE_STATE_CONFIG_INVALID) {
        // The spec is saved; its restart was refused (e.g. an api_key naming an unset
        // variable): that source halted, the others and the server go on.
        logger->Error("declared source cannot start with its updated spec",
                      {{"source_id", id},
                       {"state", handoff::v1::SourceState_Name(updated->progress().state())},
                       {"reason", updated->progress().reason()}});
      }
    } else {
      return absl::Status(created.status().code(),
                          absl::StrCat(where, ": ", created.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace handoff::server
