#include "consumer/sinks/grpc_event_sink.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "handoff/v1/event_sink.grpc.pb.h"
#include "sim/sample_sink/sample_sink.h"

namespace handoff::consumer {
namespace {

using Kind = SinkAnswer::Kind;
using handoff::sim::SampleSink;
using handoff::sim::v1::FaultConfig;

constexpr char kSource[] = "src-1";

std::string TestDb(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

std::unique_ptr<SampleSink> StartSink(const std::string& name, FaultConfig faults = {},
                                      std::function<void()> crash_hook = nullptr) {
  SampleSink::Options options;
  options.core.db_path = TestDb(name);
  options.core.faults = faults;
  options.core.crash_hook = std::move(crash_hook);
  auto sink = SampleSink::Start(std::move(options));
  EXPECT_TRUE(sink.ok()) << sink.status();
  return sink.ok() ? *std::move(sink) : nullptr;
}

std::unique_ptr<GrpcEventSink> Client(const SampleSink& sink, bool batch, int max_batch = 256,
                                      absl::Duration deadline = absl::Seconds(30)) {
  GrpcEventSinkOptions options;
  options.target = sink.target();
  options.batch = batch;
  options.max_batch = max_batch;
  options.deadline = deadline;
  auto client = GrpcEventSink::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Events at (block, log_index) = (first_block + i, i); owns the rows the deliveries point to.
class Events {
 public:
  explicit Events(int n, uint64_t first_block = 100) {
    rows_.reserve(n);
    for (int i = 0; i < n; ++i) {
      handoff::v1::EventRow row;
      row.set_block_number(first_block + i);
      row.set_log_index(i);
      row.set_block_hash(absl::StrCat("0xh", first_block + i));
      row.set_address("0xabc");
      rows_.push_back(row);
    }
    for (const auto& row : rows_) {
      deliveries_.push_back(
          Delivery{IdempotencyKey(kSource, row), &row, handoff::v1::FINALITY_SAFE});
    }
  }
  absl::Span<const Delivery> all() const { return deliveries_; }
  const Delivery& operator[](int i) const { return deliveries_[i]; }

 private:
  std::vector<handoff::v1::EventRow> rows_;
  std::vector<Delivery> deliveries_;
};

std::vector<Kind> Kinds(const std::vector<SinkAnswer>& answers) {
  std::vector<Kind> out;
  for (const auto& a : answers) out.push_back(a.kind);
  return out;
}

TEST(GrpcEventSinkTest, PerEventAppliesThenReplaysAreAlreadyApplied) {
  auto sink = StartSink("per_event");
  auto client = Client(*sink, /*batch=*/false);
  EXPECT_EQ(client->max_batch(), 1);
  Events events(3);
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())), std::vector<Kind>(3, Kind::kApplied));
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())),
            std::vector<Kind>(3, Kind::kAlreadyApplied));
  EXPECT_EQ(sink->stats().calls(), 6u);
  EXPECT_EQ(sink->stats().batch_calls(), 0u);
  auto records = sink->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 3u);
  const auto& r = records->at(events[1].idempotency_key);
  EXPECT_EQ(r.attempts, 2u);
  EXPECT_EQ(r.request.source_id(), kSource);
  EXPECT_EQ(r.request.event().block_number(), 101u);
  EXPECT_EQ(r.request.finality(), handoff::v1::FINALITY_SAFE);
}

TEST(GrpcEventSinkTest, BatchSendsChunksOfMaxBatch) {
  auto sink = StartSink("chunks");
  auto client = Client(*sink, /*batch=*/true, /*max_batch=*/4);
  EXPECT_EQ(client->max_batch(), 4);
  Events events(10);
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())), std::vector<Kind>(10, Kind::kApplied));
  EXPECT_EQ(sink->stats().calls(), 3u);
  EXPECT_EQ(sink->stats().batch_calls(), 3u);
  EXPECT_EQ(sink->stats().records(), 10u);
}

// Chunks sent in recycled calls carry exactly their own events: a long-topic, long-data
// batch followed by short ones of another source leaves nothing of itself in them.
TEST(GrpcEventSinkTest, RecycledCallsCarryOnlyTheirOwnEvents) {
  auto sink = StartSink("recycled");
  auto client = Client(*sink, /*batch=*/true, /*max_batch=*/3);
  std::vector<handoff::v1::EventRow> rows;
  for (int i = 0; i < 12; ++i) {
    handoff::v1::EventRow row;
    row.set_block_number(500 + i);
    row.set_log_index(i);
    row.set_block_hash(absl::StrCat("0x", std::string(64, 'a' + i % 6)));
    // The first six: four topics and long data; the last six: none and short.
    for (int t = 0; i < 6 && t < 4; ++t) row.add_topics(absl::StrCat("0x", std::string(64, '1')));
    row.set_data(i < 6 ? absl::StrCat("0x", std::string(4096, 'f')) : "0x01");
    rows.push_back(row);
  }
  std::vector<Delivery> first, second;
  for (int i = 0; i < 12; ++i) {
    const std::string source = i < 6 ? "long-src" : "s";
    (i < 6 ? first : second)
        .push_back(Delivery{IdempotencyKey(source, rows[i]), &rows[i],
                            i < 6 ? handoff::v1::FINALITY_SAFE : handoff::v1::FINALITY_FINALIZED});
  }
  EXPECT_EQ(Kinds(client->Deliver("long-src", first)), std::vector<Kind>(6, Kind::kApplied));
  EXPECT_EQ(Kinds(client->Deliver("s", second)), std::vector<Kind>(6, Kind::kApplied));
  auto records = sink->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 12u);
  for (int i = 0; i < 12; ++i) {
    const Delivery& d = i < 6 ? first[i] : second[i - 6];
    const auto& r = records->at(d.idempotency_key);
    EXPECT_EQ(r.request.source_id(), i < 6 ? "long-src" : "s");
    EXPECT_EQ(r.request.idempotency_key(), d.idempotency_key);
    EXPECT_EQ(r.request.finality(), d.finality);
    EXPECT_EQ(r.request.event().SerializeAsString(), rows[i].SerializeAsString()) << i;
  }
}

TEST(BatchCallPoolTest, HandsOutEmptyCallsAndKeepsABoundedFew) {
  BatchCallPool pool(/*max_calls=*/2);
  std::unique_ptr<BatchCall> a = pool.Take();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->request.events_size(), 0);
  a->request.add_events()->set_idempotency_key("k");
  a->response.add_results()->set_message("m");
  const handoff::v1::ApplyBatchRequest* kept = &a->request;
  pool.Give(std::move(a));
  EXPECT_EQ(pool.held(), 1u);
  std::unique_ptr<BatchCall> b = pool.Take();
  EXPECT_EQ(&b->request, kept);  // the same call back, cleared
  EXPECT_EQ(b->request.events_size(), 0);
  EXPECT_EQ(b->response.results_size(), 0);
  EXPECT_EQ(pool.held(), 0u);
  // No more than max_calls are kept.
  pool.Give(std::move(b));
  pool.Give(pool.Take());
  pool.Give(std::make_unique<BatchCall>());
  pool.Give(std::make_unique<BatchCall>());
  EXPECT_EQ(pool.held(), 2u);
}

// A recycled call keeps each event's message and its strings' memory: the next batch
// fills them in place instead of allocating ~10 heap blocks per event (bench/HISTORY.md
// item 96: ApplyRequest::Clear deletes the event, a message field without presence).
TEST(BatchCallPoolTest, ARecycledCallKeepsItsEventsMemory) {
  BatchCallPool pool(/*max_calls=*/1);
  std::unique_ptr<BatchCall> a = pool.Take();
  handoff::v1::EventRow* row = a->AddEvent()->mutable_event();
  row->set_data(std::string(4096, 'd'));
  a->AddEvent()->mutable_event()->set_data("second");
  pool.Give(std::move(a));
  std::unique_ptr<BatchCall> b = pool.Take();
  EXPECT_EQ(b->request.events_size(), 0);
  handoff::v1::ApplyRequest* first = b->AddEvent();
  handoff::v1::ApplyRequest* second = b->AddEvent();
  // Both kept messages come back, one of them with the 4 KiB string's memory.
  const size_t kept = std::max(first->mutable_event()->mutable_data()->capacity(),
                               second->mutable_event()->mutable_data()->capacity());
  EXPECT_GE(kept, 4096u);
  EXPECT_TRUE(b->spare_events.empty());
  // A filled request carries only what it was given.
  handoff::v1::EventRow fresh;
  fresh.set_block_number(7);
  *first->mutable_event() = fresh;
  EXPECT_EQ(first->event().SerializeAsString(), fresh.SerializeAsString());
  EXPECT_EQ(b->AddEvent()->has_event(), false);  // no spare left: a plain new request
}

TEST(GrpcEventSinkTest, OutcomesMapToAnswerKinds) {
  FaultConfig faults;
  faults.mutable_reject()->add_blocks(100);
  faults.mutable_review()->add_blocks(101);
  faults.mutable_ignore()->add_blocks(102);
  for (bool batch : {false, true}) {
    SCOPED_TRACE(batch);
    auto sink = StartSink(absl::StrCat("outcomes_", batch), faults);
    auto client = Client(*sink, batch);
    Events events(4);
    auto answers = client->Deliver(kSource, events.all());
    EXPECT_EQ(Kinds(answers), (std::vector<Kind>{Kind::kRejected, Kind::kNeedsReview,
                                                 Kind::kIgnored, Kind::kApplied}));
    EXPECT_EQ(answers[0].message, "fault knob: rejected");
    EXPECT_FALSE(answers[0].retry_after.has_value());
  }
}

TEST(GrpcEventSinkTest, RetryLaterCarriesTheSinksDelay) {
  FaultConfig faults;
  faults.set_fail_next_calls(1);
  faults.set_fail_mode(handoff::sim::v1::FAIL_MODE_RETRY_LATER);
  faults.set_retry_after_ms(750);
  auto sink = StartSink("retry_later", faults);
  auto client = Client(*sink, /*batch=*/true);
  Events events(2);
  auto answers = client->Deliver(kSource, events.all());
  ASSERT_EQ(Kinds(answers), std::vector<Kind>(2, Kind::kRetryLater));
  ASSERT_TRUE(answers[1].retry_after.has_value());
  EXPECT_EQ(*answers[1].retry_after, absl::Milliseconds(750));
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())), std::vector<Kind>(2, Kind::kApplied));
}

TEST(GrpcEventSinkTest, UnavailableIsATransportErrorAndStopsTheCall) {
  FaultConfig faults;
  faults.set_fail_next_calls(1);
  faults.set_fail_mode(handoff::sim::v1::FAIL_MODE_UNAVAILABLE);
  auto sink = StartSink("unavailable", faults);
  auto client = Client(*sink, /*batch=*/false);
  Events events(3);
  auto answers = client->Deliver(kSource, events.all());
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(3, Kind::kTransportError));
  EXPECT_TRUE(absl::StrContains(answers[0].message, "UNAVAILABLE")) << answers[0].message;
  EXPECT_TRUE(absl::StrContains(answers[2].message, "not sent")) << answers[2].message;
  EXPECT_EQ(sink->stats().calls(), 1u);  // the rest were not sent
  EXPECT_EQ(sink->stats().records(), 0u);
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())), std::vector<Kind>(3, Kind::kApplied));
}

TEST(GrpcEventSinkTest, DeadlineExceededIsATransportError) {
  FaultConfig faults;
  faults.set_delay_ms(60000);
  auto sink = StartSink("deadline", faults);
  auto client = Client(*sink, /*batch=*/true, 256, absl::Milliseconds(200));
  Events events(2);
  const absl::Time start = absl::Now();
  auto answers = client->Deliver(kSource, events.all());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_TRUE(absl::StrContains(answers[0].message, "DEADLINE_EXCEEDED")) << answers[0].message;
}

TEST(GrpcEventSinkTest, ResultsMissingFromAShortBatchAreTransportErrors) {
  FaultConfig faults;
  faults.set_batch_answer_limit(2);
  auto sink = StartSink("short", faults);
  auto client = Client(*sink, /*batch=*/true, /*max_batch=*/3);
  Events events(5);
  auto answers = client->Deliver(kSource, events.all());
  EXPECT_EQ(Kinds(answers),
            (std::vector<Kind>{Kind::kApplied, Kind::kApplied, Kind::kTransportError,
                               Kind::kTransportError, Kind::kTransportError}));
  EXPECT_TRUE(absl::StrContains(answers[2].message, "missing")) << answers[2].message;
  EXPECT_EQ(sink->stats().batch_calls(), 1u);  // the next chunk was not sent
  EXPECT_EQ(sink->stats().records(), 2u);
}

// An EventSink whose ApplyBatch answers APPLIED to every event and `extra` more (a reply
// longer than the request when extra > 0), and whose server takes requests of at most
// `max_receive_bytes` (gRPC answers RESOURCE_EXHAUSTED to larger ones; -1: gRPC's default,
// 4 MiB). On port 0 of the loopback; serves until destroyed.
class LongReplySink final : public handoff::v1::EventSink::Service {
 public:
  explicit LongReplySink(int extra, int max_receive_bytes = -1) : extra_(extra) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    if (max_receive_bytes > 0) builder.SetMaxReceiveMessageSize(max_receive_bytes);
    server_ = builder.BuildAndStart();
  }
  ~LongReplySink() override { server_->Shutdown(); }

  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  int batch_calls() const { return batch_calls_.load(); }
  int events() const { return events_.load(); }

  grpc::Status ApplyBatch(grpc::ServerContext*, const handoff::v1::ApplyBatchRequest* request,
                          handoff::v1::ApplyBatchResponse* response) override {
    batch_calls_.fetch_add(1);
    events_.fetch_add(request->events_size());
    for (int i = 0; i < request->events_size() + extra_; ++i) {
      response->add_results()->set_outcome(handoff::v1::APPLY_OUTCOME_APPLIED);
    }
    return grpc::Status::OK;
  }

 private:
  const int extra_;
  int port_ = 0;
  std::atomic<int> batch_calls_{0};  // written on gRPC's threads
  std::atomic<int> events_{0};
  std::unique_ptr<grpc::Server> server_;
};

// `n` events whose data is `data_bytes` long.
std::vector<handoff::v1::EventRow> LargeRows(int n, size_t data_bytes) {
  std::vector<handoff::v1::EventRow> rows(n);
  for (int i = 0; i < n; ++i) {
    rows[i].set_block_number(700 + i);
    rows[i].set_log_index(0);
    rows[i].set_block_hash(absl::StrCat("0x", std::string(64, 'b')));
    rows[i].set_data(absl::StrCat("0x", std::string(data_bytes, 'e')));
  }
  return rows;
}

std::vector<Delivery> DeliveriesOf(const std::vector<handoff::v1::EventRow>& rows) {
  std::vector<Delivery> out;
  for (const auto& row : rows) {
    out.push_back(Delivery{IdempotencyKey(kSource, row), &row, handoff::v1::FINALITY_FINALIZED});
  }
  return out;
}

std::unique_ptr<GrpcEventSink> BatchClient(const std::string& target, int max_batch) {
  GrpcEventSinkOptions options;
  options.target = target;
  options.batch = true;
  options.max_batch = max_batch;
  options.deadline = absl::Seconds(30);
  auto client = GrpcEventSink::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// max_batch counts events, not bytes: 100 events of 100 KB (10 MB) would exceed gRPC's
// default 4 MiB request limit on every try. Chunks stop short of it.
TEST(GrpcEventSinkTest, BatchesStayUnderTheDefaultRequestSize) {
  LongReplySink sink(/*extra=*/0);
  auto client = BatchClient(sink.target(), /*max_batch=*/100);
  const std::vector<handoff::v1::EventRow> rows = LargeRows(100, 100 << 10);
  const std::vector<Delivery> deliveries = DeliveriesOf(rows);
  EXPECT_EQ(Kinds(client->Deliver(kSource, deliveries)), std::vector<Kind>(100, Kind::kApplied));
  EXPECT_EQ(sink.events(), 100);
  EXPECT_GE(sink.batch_calls(), 3);
  // Send's one batch too: answered in full, in as many calls as it takes.
  const std::vector<handoff::v1::EventRow> more = LargeRows(60, 100 << 10);
  EXPECT_EQ(Kinds(client->Send(kSource, DeliveriesOf(more)).get()),
            std::vector<Kind>(60, Kind::kApplied));
  EXPECT_EQ(sink.events(), 160);
}

// A sink that takes smaller requests than 4 MiB answers RESOURCE_EXHAUSTED: the events are
// retried (transport errors, no attempt used) in batches half as large each time, and
// the smaller size is kept, instead of the same batch failing forever.
TEST(GrpcEventSinkTest, ARequestTooLargeForTheSinkHalvesTheBatch) {
  LongReplySink sink(/*extra=*/0, /*max_receive_bytes=*/64 << 10);
  auto client = BatchClient(sink.target(), /*max_batch=*/1000);
  const std::vector<handoff::v1::EventRow> rows = LargeRows(1000, 1000);
  const std::vector<Delivery> deliveries = DeliveriesOf(rows);
  std::vector<SinkAnswer> answers = client->Deliver(kSource, deliveries);
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(1000, Kind::kTransportError));
  EXPECT_TRUE(absl::StrContains(answers[0].message, "RESOURCE_EXHAUSTED")) << answers[0].message;
  EXPECT_EQ(client->max_batch(), 500);
  int tries = 1;
  while (Kinds(answers) != std::vector<Kind>(1000, Kind::kApplied) && tries < 10) {
    answers = client->Deliver(kSource, deliveries);
    ++tries;
  }
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(1000, Kind::kApplied));
  EXPECT_EQ(tries, 6);  // 1000, 500, 250, 125, 62 refused; 31 (~33 KB) taken
  EXPECT_EQ(client->max_batch(), 31);
  EXPECT_EQ(sink.events(), 1000);
}

// Answers carry no key: a reply longer than the request shows they may not line up with
// the events, so none of them is taken as a receipt (each is a transport error, which
// uses no attempt) and, as after a short reply, the later events are not sent.
TEST(GrpcEventSinkTest, ALongBatchReplyAnswersNothing) {
  LongReplySink sink(/*extra=*/1);
  GrpcEventSinkOptions options;
  options.target = sink.target();
  options.batch = true;
  options.max_batch = 3;
  options.deadline = absl::Seconds(30);
  auto client = GrpcEventSink::Create(std::move(options));
  ASSERT_TRUE(client.ok()) << client.status();
  Events events(5);
  auto answers = (*client)->Deliver(kSource, events.all());
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(5, Kind::kTransportError));
  EXPECT_TRUE(absl::StrContains(answers[0].message, "4 results for 3 events"))
      << answers[0].message;
  EXPECT_EQ(sink.batch_calls(), 1);  // the next chunk was not sent
  // Send's one batch likewise.
  Events two(2, /*first_block=*/300);
  EXPECT_EQ(Kinds((*client)->Send(kSource, two.all()).get()),
            std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_EQ(sink.batch_calls(), 2);
}

TEST(GrpcEventSinkTest, UnimplementedBatchFallsBackToApplyForGood) {
  FaultConfig faults;
  faults.set_batch_unimplemented(true);
  auto sink = StartSink("fallback", faults);
  auto client = Client(*sink, /*batch=*/true, /*max_batch=*/4);
  EXPECT_EQ(client->max_batch(), 4);
  Events events(3);
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())), std::vector<Kind>(3, Kind::kApplied));
  EXPECT_EQ(client->max_batch(), 1);
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
  EXPECT_EQ(sink->stats().calls(), 4u);
  Events more(2, /*first_block=*/500);
  EXPECT_EQ(Kinds(client->Deliver(kSource, more.all())), std::vector<Kind>(2, Kind::kApplied));
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
  EXPECT_EQ(sink->stats().calls(), 6u);
}

TEST(GrpcEventSinkTest, CancelUnblocksAnInFlightCallAndFailsLaterOnes) {
  FaultConfig faults;
  faults.set_delay_ms(60000);
  auto sink = StartSink("cancel", faults);
  auto client = Client(*sink, /*batch=*/false, 256, absl::Seconds(60));
  Events events(2);
  std::vector<SinkAnswer> answers;
  std::thread worker([&] { answers = client->Deliver(kSource, events.all()); });
  ASSERT_TRUE(sink->WaitForCalls(1, absl::Seconds(30)));
  const absl::Time start = absl::Now();
  client->Cancel();
  worker.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_TRUE(absl::StrContains(answers[0].message, "CANCELLED")) << answers[0].message;

  auto later = client->Deliver(kSource, events.all());
  EXPECT_EQ(Kinds(later), std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_EQ(sink->stats().calls(), 1u);  // nothing more was sent
}

// Send: one ApplyBatch whose request is built before Send returns, so the rows may be
// changed at once; the answers come through the future.
TEST(GrpcEventSinkTest, SendIsOneBatchThatNoLongerNeedsItsRows) {
  auto sink = StartSink("send");
  auto client = Client(*sink, /*batch=*/true, /*max_batch=*/4);
  std::vector<handoff::v1::EventRow> rows;
  for (int i = 0; i < 3; ++i) {
    handoff::v1::EventRow row;
    row.set_block_number(700 + i);
    row.set_block_hash(absl::StrCat("0xs", i));
    rows.push_back(row);
  }
  std::vector<Delivery> deliveries;
  for (const auto& row : rows) {
    deliveries.push_back(Delivery{IdempotencyKey(kSource, row), &row, handoff::v1::FINALITY_SAFE});
  }
  std::future<std::vector<SinkAnswer>> answers = client->Send(kSource, deliveries);
  for (auto& row : rows) row.set_block_number(1);  // reused once Send returned
  EXPECT_EQ(Kinds(answers.get()), std::vector<Kind>(3, Kind::kApplied));
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
  auto records = sink->Records();
  ASSERT_TRUE(records.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(records->at(deliveries[i].idempotency_key).request.event().block_number(),
              700u + i);
  }
  // More than one batch: sent as Deliver sends it, chunk after chunk, over copies.
  Events events(6, /*first_block=*/800);
  EXPECT_EQ(Kinds(client->Send(kSource, events.all()).get()),
            std::vector<Kind>(6, Kind::kApplied));
  EXPECT_EQ(sink->stats().batch_calls(), 3u);
}

TEST(GrpcEventSinkTest, SendToASinkWithoutBatchesAnswersNothingAndSwitchesToApply) {
  FaultConfig faults;
  faults.set_batch_unimplemented(true);
  auto sink = StartSink("send_fallback", faults);
  auto client = Client(*sink, /*batch=*/true, /*max_batch=*/4);
  Events events(3);
  EXPECT_TRUE(client->Send(kSource, events.all()).get().empty());  // send them again
  EXPECT_EQ(client->max_batch(), 1);
  EXPECT_EQ(sink->stats().records(), 0u);
  EXPECT_EQ(Kinds(client->Send(kSource, events.all()).get()),
            std::vector<Kind>(3, Kind::kApplied));
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
  EXPECT_EQ(sink->stats().calls(), 4u);
}

TEST(GrpcEventSinkTest, CancelAnswersASendInFlight) {
  FaultConfig faults;
  faults.set_delay_ms(60000);
  auto sink = StartSink("send_cancel", faults);
  auto client = Client(*sink, /*batch=*/true, 256, absl::Seconds(60));
  Events events(2);
  std::future<std::vector<SinkAnswer>> answers = client->Send(kSource, events.all());
  ASSERT_TRUE(sink->WaitForCalls(1, absl::Seconds(30)));
  client->Cancel();
  EXPECT_EQ(Kinds(answers.get()), std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_EQ(Kinds(client->Send(kSource, events.all()).get()),
            std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_EQ(sink->stats().calls(), 1u);
}

// The caller may destroy the sink as soon as it has a Send's answers, here cancelled
// ones: gRPC's callback thread must not be left holding the channel's last reference
// (before the fix, gRPC aborted in grpc_cq_internal_unref in 2-4 of 10 runs of this
// test, and CancelAnswersASendInFlight in 9 of 150).
TEST(GrpcEventSinkTest, ASinkDestroyedOnItsCancelledAnswersLeavesGrpcWhole) {
  FaultConfig faults;
  faults.set_delay_ms(60000);
  auto sink = StartSink("send_destroy", faults);
  Events events(2);
  for (int i = 0; i < 150; ++i) {
    auto client = Client(*sink, /*batch=*/true, 256, absl::Seconds(60));
    std::future<std::vector<SinkAnswer>> answers = client->Send(kSource, events.all());
    ASSERT_TRUE(sink->WaitForCalls(i + 1, absl::Seconds(30)));
    client->Cancel();
    EXPECT_EQ(Kinds(answers.get()), std::vector<Kind>(2, Kind::kTransportError));
    client.reset();
  }
}

TEST(GrpcEventSinkTest, AnUnreachableSinkIsATransportError) {
  // A port bound and not listening: connections are refused, and no other test's server
  // can take it meanwhile (as one could a stopped sink's port).
  const int reserved = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(reserved, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(reserved, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(reserved, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  absl::Cleanup close_reserved = [reserved] { close(reserved); };
  GrpcEventSinkOptions options;
  options.target = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  options.deadline = absl::Seconds(10);
  auto client = GrpcEventSink::Create(options);
  ASSERT_TRUE(client.ok());
  Events events(2);
  auto answers = (*client)->Deliver(kSource, events.all());
  EXPECT_EQ(Kinds(answers), std::vector<Kind>(2, Kind::kTransportError));
  EXPECT_TRUE(absl::StrContains(answers[0].message, "UNAVAILABLE")) << answers[0].message;
}

TEST(GrpcEventSinkTest, ACrashAfterRecordingIsRetriedAndRecognised) {
  FaultConfig faults;
  faults.set_die_after_records(2);
  const std::string name = "crash";
  Events events(3);
  {
    // Written on the sink's handler thread; the RPC's failure orders it before the read
    // through gRPC, which ThreadSanitizer cannot see.
    std::atomic<int> crashes{0};
    auto sink = StartSink(name, faults, [&] { ++crashes; });
    auto client = Client(*sink, /*batch=*/true);
    EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())),
              std::vector<Kind>(3, Kind::kTransportError));
    EXPECT_EQ(crashes.load(), 1);
  }
  auto sink = StartSink(name);  // the restarted sink, same table
  auto client = Client(*sink, /*batch=*/true);
  EXPECT_EQ(Kinds(client->Deliver(kSource, events.all())),
            (std::vector<Kind>{Kind::kAlreadyApplied, Kind::kAlreadyApplied, Kind::kApplied}));
  auto records = sink->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ(records->at(events[0].idempotency_key).attempts, 2u);
  EXPECT_EQ(records->at(events[2].idempotency_key).attempts, 1u);
}

TEST(GrpcEventSinkTest, ADeliveryWithoutARowIsNotSent) {
  auto sink = StartSink("no_row");
  auto client = Client(*sink, /*batch=*/false);
  Delivery d{"k", nullptr, handoff::v1::FINALITY_LATEST};
  auto answers = client->Deliver(kSource, absl::MakeConstSpan(&d, 1));
  EXPECT_EQ(Kinds(answers), std::vector<Kind>{Kind::kTransportError});
  EXPECT_EQ(sink->stats().calls(), 0u);
}

TEST(GrpcEventSinkTest, CreateRejectsBadOptions) {
  GrpcEventSinkOptions options;
  EXPECT_EQ(GrpcEventSink::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.target = "127.0.0.1:1";
  options.max_batch = 0;
  EXPECT_EQ(GrpcEventSink::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.max_batch = 1;
  options.deadline = absl::ZeroDuration();
  EXPECT_EQ(GrpcEventSink::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeExternalSinkTest, LocalRowsHaveNoExternalSink) {
  handoff::v1::SourceSpec spec;
  spec.set_id("s");
  auto none = MakeExternalSink(spec);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  spec.mutable_sink()->mutable_local_rows();
  auto rows = MakeExternalSink(spec);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, nullptr);
}

TEST(MakeExternalSinkTest, DownstreamSpecsAreChecked) {
  handoff::v1::SourceSpec spec;
  spec.set_id("s");
  spec.mutable_sink()->mutable_downstream();
  auto no_target = MakeExternalSink(spec);
  EXPECT_EQ(no_target.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(no_target.status().message(), "source s"));
  spec.mutable_sink()->mutable_downstream()->set_target("127.0.0.1:1");
  spec.mutable_sink()->mutable_downstream()->set_max_batch(GrpcEventSink::kMaxBatchLimit + 1);
  EXPECT_EQ(MakeExternalSink(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeExternalSinkTest, DownstreamSpecDeliversWithItsDefaults) {
  auto sink = StartSink("factory");
  handoff::v1::SourceSpec spec;
  spec.set_id(kSource);
  auto* d = spec.mutable_sink()->mutable_downstream();
  d->set_target(sink->target());
  auto per_event = MakeExternalSink(spec);
  ASSERT_TRUE(per_event.ok()) << per_event.status();
  ASSERT_NE(*per_event, nullptr);
  EXPECT_EQ((*per_event)->max_batch(), 1);

  d->set_batch(true);
  d->set_deadline_ms(10000);
  auto batched = MakeExternalSink(spec);
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ((*batched)->max_batch(), 256);
  Events events(3);
  EXPECT_EQ(Kinds((*batched)->Deliver(kSource, events.all())),
            std::vector<Kind>(3, Kind::kApplied));
  EXPECT_EQ(sink->stats().batch_calls(), 1u);
}

}  // namespace
}  // namespace handoff::consumer
