// sample_sink: the sample downstream EventSink service as a process. Flags only: they
// become SampleSink::Options, then the process serves until SIGTERM/SIGINT. The fault
// knobs can be changed at run time over SampleSinkAdmin.
//
// --tls_cert/--tls_key serve TLS (--tls_client_ca: mTLS) and --bearer_token_file requires
// a bearer token of EventSink calls, as handoffd's sink.downstream.tls and .token send.
//
// Prints "sample_sink listening on <host>:<port>" on stdout once serving (and writes the
// port to --port_file if given), so a harness starting it with --port=0 can find it.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "sim/sample_sink/sample_sink.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Listening address.");
ABSL_FLAG(int, port, 0, "Listening port (0: pick a free one).");
ABSL_FLAG(std::string, port_file, "", "If set, the bound port is written here.");
ABSL_FLAG(std::string, db_path, "", "RocksDB folder of the idempotency table (required).");
ABSL_FLAG(bool, sync, true, "fsync every write.");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain; serves TLS with --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require and verify client certificates (mTLS). Needs --tls_cert.");
ABSL_FLAG(std::string, bearer_token_file, "",
          "If set, EventSink calls must carry `authorization: Bearer <this file's text, "
          "trimmed>` (else UNAUTHENTICATED).");

ABSL_FLAG(uint32_t, fail_next_calls, 0, "Fail the next N calls.");
ABSL_FLAG(std::string, fail_mode, "retry_later", "retry_later or unavailable.");
ABSL_FLAG(uint32_t, retry_after_ms, 0, "retry_after_ms sent with RETRY_LATER.");
ABSL_FLAG(uint64_t, reject_log_index_mod, 0, "REJECTED when log_index % K == 0.");
ABSL_FLAG(std::string, reject_blocks, "", "REJECTED for these blocks (comma-separated).");
ABSL_FLAG(uint64_t, review_log_index_mod, 0, "NEEDS_REVIEW when log_index % K == 0.");
ABSL_FLAG(std::string, review_blocks, "", "NEEDS_REVIEW for these blocks.");
ABSL_FLAG(uint64_t, ignore_log_index_mod, 0, "IGNORED when log_index % K == 0.");
ABSL_FLAG(std::string, ignore_blocks, "", "IGNORED for these blocks.");
ABSL_FLAG(uint32_t, delay_ms, 0, "Delay every call by this much.");
ABSL_FLAG(uint64_t, die_after_records, 0,
          "Abort right after the N-th new record of this process is durable.");
ABSL_FLAG(uint64_t, die_before_records, 0,
          "Abort right before the N-th new record of this process is written.");
ABSL_FLAG(bool, batch_unimplemented, false, "ApplyBatch answers UNIMPLEMENTED.");
ABSL_FLAG(uint32_t, batch_answer_limit, 0, "ApplyBatch answers only the first N events.");

namespace {

bool FillPredicate(uint64_t modulo, const std::string& blocks,
                   handoff::sim::v1::EventPredicate* p) {
  p->set_log_index_modulo(modulo);
  for (absl::string_view part : absl::StrSplit(blocks, ',', absl::SkipEmpty())) {
    uint64_t block = 0;
    if (!absl::SimpleAtoi(part, &block)) return false;
    p->add_blocks(block);
  }
  return true;
}

// The whole file at `path` into `out` ("" leaves it empty); false if it cannot be read.
bool ReadFlagFile(const std::string& flag, const std::string& path, std::string* out) {
  if (path.empty()) return true;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "--%s: cannot read %s\n", flag.c_str(), path.c_str());
    return false;
  }
  std::stringstream text;
  text << in.rdbuf();
  *out = text.str();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);

  handoff::sim::SampleSink::Options options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.core.db_path = absl::GetFlag(FLAGS_db_path);
  options.core.sync = absl::GetFlag(FLAGS_sync);
  if (!ReadFlagFile("tls_cert", absl::GetFlag(FLAGS_tls_cert), &options.tls_cert_chain) ||
      !ReadFlagFile("tls_key", absl::GetFlag(FLAGS_tls_key), &options.tls_private_key) ||
      !ReadFlagFile("tls_client_ca", absl::GetFlag(FLAGS_tls_client_ca),
                    &options.tls_client_ca) ||
      !ReadFlagFile("bearer_token_file", absl::GetFlag(FLAGS_bearer_token_file),
                    &options.bearer_token)) {
    return 2;
  }
  options.bearer_token = std::string(absl::StripAsciiWhitespace(options.bearer_token));
  if (!absl::GetFlag(FLAGS_bearer_token_file).empty() && options.bearer_token.empty()) {
    std::fprintf(stderr, "--bearer_token_file: the file is empty\n");
    return 2;
  }
  handoff::sim::v1::FaultConfig& f = options.core.faults;
  f.set_fail_next_calls(absl::GetFlag(FLAGS_fail_next_calls));
  const std::string mode = absl::GetFlag(FLAGS_fail_mode);
  if (mode == "retry_later") {
    f.set_fail_mode(handoff::sim::v1::FAIL_MODE_RETRY_LATER);
  } else if (mode == "unavailable") {
    f.set_fail_mode(handoff::sim::v1::FAIL_MODE_UNAVAILABLE);
  } else {
    std::fprintf(stderr, "--fail_mode must be retry_later or unavailable\n");
    return 2;
  }
  f.set_retry_after_ms(absl::GetFlag(FLAGS_retry_after_ms));
  if (!FillPredicate(absl::GetFlag(FLAGS_reject_log_index_mod), absl::GetFlag(FLAGS_reject_blocks),
                     f.mutable_reject()) ||
      !FillPredicate(absl::GetFlag(FLAGS_review_log_index_mod), absl::GetFlag(FLAGS_review_blocks),
                     f.mutable_review()) ||
      !FillPredicate(absl::GetFlag(FLAGS_ignore_log_index_mod), absl::GetFlag(FLAGS_ignore_blocks),
                     f.mutable_ignore())) {
    std::fprintf(stderr, "block lists are comma-separated numbers\n");
    return 2;
  }
  f.set_delay_ms(absl::GetFlag(FLAGS_delay_ms));
  f.set_die_after_records(absl::GetFlag(FLAGS_die_after_records));
  f.set_die_before_records(absl::GetFlag(FLAGS_die_before_records));
  f.set_batch_unimplemented(absl::GetFlag(FLAGS_batch_unimplemented));
  f.set_batch_answer_limit(absl::GetFlag(FLAGS_batch_answer_limit));

  // Block the stop signals before gRPC starts its threads; this thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<handoff::sim::SampleSink>> sink =
      handoff::sim::SampleSink::Start(std::move(options));
  if (!sink.ok()) {
    std::fprintf(stderr, "sample_sink: %s\n", sink.status().ToString().c_str());
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    // Written then renamed, so a reader never sees a partial file.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*sink)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::printf("sample_sink listening on %s\n", (*sink)->target().c_str());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop_signals, &signal);
  (*sink)->Stop();
  return 0;
}
