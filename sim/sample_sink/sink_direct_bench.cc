// sink_direct_bench: the sample sink's own delivery rate, called directly over loopback
// gRPC (no Handoff in between): sequential single Apply calls, then sequential ApplyBatch
// calls of --batch_size events. Every event has a fresh idempotency key, so each one is a
// durable new record (one sync per Apply call, one per ApplyBatch call). Prints one JSON
// object on stdout. The baseline Handoff's delivery benchmarks compare against.
//
// By default it starts an in-process SampleSink on a fresh table at --db_path (or a
// scratch folder under TEST_TMPDIR or /tmp, removed afterwards); with --target it
// measures a running sink instead.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "handoff/v1/event_sink.grpc.pb.h"
#include "sim/sample_sink/sample_sink.h"

ABSL_FLAG(std::string, target, "", "A running sink to measure (default: in-process).");
ABSL_FLAG(std::string, db_path, "", "Table folder of the in-process sink (fresh).");
ABSL_FLAG(bool, sync, true, "In-process sink: fsync every write.");
ABSL_FLAG(int, single_events, 2000, "Events sent as single Apply calls.");
ABSL_FLAG(int, batch_events, 51200, "Events sent as ApplyBatch calls.");
ABSL_FLAG(int, batch_size, 256, "Events per ApplyBatch call.");

namespace {

using handoff::v1::ApplyRequest;

void Fill(ApplyRequest* r, const std::string& run, const char* phase, int i) {
  r->set_source_id("bench");
  r->set_idempotency_key(absl::StrCat("bench/", run, "-", phase, "/", i));
  handoff::v1::EventRow* e = r->mutable_event();
  e->set_block_number(1000000 + i / 16);
  e->set_log_index(i % 16);
  e->set_block_hash(absl::StrCat("0x", run, phase));
  e->set_address("0x00000000000000000000000000000000deadbeef");
  e->add_topics("0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef");
  e->set_data(std::string(64, 'a'));
  r->set_finality(handoff::v1::FINALITY_FINALIZED);
}

struct Phase {
  int events = 0;
  int calls = 0;
  int errors = 0;  // failed RPCs or non-APPLIED answers
  double seconds = 0;
  std::string Json(const char* name) const {
    const double rate = seconds > 0 ? events / seconds : 0;
    return absl::StrCat("\"", name, "\":{\"events\":", events, ",\"calls\":", calls,
                        ",\"errors\":", errors, ",\"seconds\":", seconds,
                        ",\"events_per_s\":", rate, "}");
  }
};

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(30);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string run = absl::StrCat(absl::ToUnixMicros(absl::Now()));

  std::unique_ptr<handoff::sim::SampleSink> sink;
  std::string scratch_db;  // a table this run created and removes at the end
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    std::string db = absl::GetFlag(FLAGS_db_path);
    if (db.empty()) {
      const char* tmp = std::getenv("TEST_TMPDIR");
      db = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/sink_direct_bench-", run);
      scratch_db = db;
    }
    handoff::sim::SampleSink::Options options;
    options.core.db_path = db;
    options.core.sync = absl::GetFlag(FLAGS_sync);
    auto started = handoff::sim::SampleSink::Start(std::move(options));
    if (!started.ok()) {
      std::fprintf(stderr, "sink_direct_bench: %s\n", started.status().ToString().c_str());
      return 1;
    }
    sink = *std::move(started);
    target = sink->target();
  }
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = handoff::v1::EventSink::NewStub(channel);
  if (!channel->WaitForConnected(Deadline())) {
    std::fprintf(stderr, "sink_direct_bench: cannot connect to %s\n", target.c_str());
    return 1;
  }

  Phase single;
  {
    ApplyRequest request;
    handoff::v1::ApplyResponse response;
    const absl::Time start = absl::Now();
    for (int i = 0; i < absl::GetFlag(FLAGS_single_events); ++i) {
      request.Clear();
      Fill(&request, run, "single", i);
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline());
      grpc::Status s = stub->Apply(&ctx, request, &response);
      ++single.calls;
      ++single.events;
      if (!s.ok() || response.outcome() != handoff::v1::APPLY_OUTCOME_APPLIED) ++single.errors;
    }
    single.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  }

  Phase batch;
  {
    const int total = absl::GetFlag(FLAGS_batch_events);
    const int size = std::max(1, absl::GetFlag(FLAGS_batch_size));
    handoff::v1::ApplyBatchRequest request;
    handoff::v1::ApplyBatchResponse response;
    const absl::Time start = absl::Now();
    for (int first = 0; first < total; first += size) {
      request.Clear();
      const int n = std::min(size, total - first);
      for (int i = first; i < first + n; ++i) Fill(request.add_events(), run, "batch", i);
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline());
      grpc::Status s = stub->ApplyBatch(&ctx, request, &response);
      ++batch.calls;
      batch.events += n;
      if (!s.ok()) {
        batch.errors += n;
        continue;
      }
      batch.errors += n - response.results_size();
      for (const auto& r : response.results()) {
        if (r.outcome() != handoff::v1::APPLY_OUTCOME_APPLIED) ++batch.errors;
      }
    }
    batch.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  }

  std::printf("{\"target\":\"%s\",\"in_process\":%s,\"sync\":%s,\"batch_size\":%d,%s,%s}\n",
              target.c_str(), sink != nullptr ? "true" : "false",
              absl::GetFlag(FLAGS_sync) ? "true" : "false", absl::GetFlag(FLAGS_batch_size),
              single.Json("single").c_str(), batch.Json("batch").c_str());
  sink.reset();  // closes the table
  if (!scratch_db.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(scratch_db, ignored);
  }
  return single.errors + batch.errors == 0 ? 0 : 1;
}
