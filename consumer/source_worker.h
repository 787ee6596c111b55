// SourceWorker: the worker of one running source. Owns its threads: the ingest loop
// (fetch a page, run its PageAttempt, repeat) and, for SAFE/FINALIZED delivery gates,
// the outbox dispatcher (deliver outbox entries at or below the gate mark, through the
// same PageAttempt procedure on the delivery stage).
//
// States (handoff.v1.SourceState): STARTING -> RUNNING <-> BACKING_OFF /
// BLOCKED_ON_HOLD, then STOPPED, or a halted state (RESYNC_REQUIRED, FUNDING_REQUIRED,
// AUTH_FAILED, CONFIG_INVALID, PROTOCOL_VIOLATION, STORAGE_FAILED) in which the threads
// have exited. A waiting worker blocks on a condition variable: no CPU. A caught-up
// source with a polled provider hands its polls to Parts::idle_poller and waits untimed
// until one finds more than nothing new, which the ingest loop then handles as a page
// it fetched itself (its thread sleeps through every idle poll).
//
// Shutdown order (RequestStop, then Join): set the stop flag; cancel the provider and
// the sink so that blocking I/O returns at once; wake waits; each thread leaves at its
// next safe point (between durable steps: a step is one atomic WriteBatch, so there is
// never half a step); Join waits for both threads. Nothing is promoted on the way out:
// a cancelled page attempt ends without its barrier.
//
// Pipelined syncs (WorkerOptions::max_unsynced_pages): a page's barrier is written
// without waiting for its fsync; the ingest thread prepares and writes the next pages
// while the store's WalSyncer syncs it. Invariant: a page is published (progress board,
// observer, the dispatcher's gate, fault points after its commit) only once its sync
// completed, in page order, and before any Fetch that could wait for news upstream
// (Provider::Ready), any wait, halt or exit.
//
// A storage failure halts the worker as STORAGE_FAILED: it closes its provider
// connection, reports the error, and advances nothing (the store refuses writes after
// a failed one or a failed sync).
//
// Thread-safe. Start, RequestStop, Join and Poke may be called from any thread; Stop is
// safe when never started.
#ifndef HANDOFF_CONSUMER_SOURCE_WORKER_H_
#define HANDOFF_CONSUMER_SOURCE_WORKER_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "consumer/backoff.h"
#include "consumer/deferred_deleter.h"
#include "consumer/idle_poller.h"
#include "consumer/observer.h"
#include "consumer/page_attempt.h"
#include "consumer/progress_board.h"
#include "consumer/provider.h"
#include "consumer/sink.h"
#include "consumer/unpublished_writes.h"
#include "consumer/unrecorded_sends.h"
#include "handoff/v1/source.pb.h"
#include "store/store.h"

namespace handoff::consumer {

struct WorkerOptions {
  int max_events_per_step = 1000;
  bool fuse_barrier = true;
  // Outbox entries per delivery attempt.
  int delivery_run = 1000;
  // Consecutive malformed pages before the source halts as PROTOCOL_VIOLATION.
  int max_malformed_pages = 5;
  // Backoff between fetch retries (full jitter: refusals spread out).
  BackoffPolicy fetch_backoff;
  // Wait between polls that find nothing new (a caught-up source): the same growth,
  // but equal jitter, so 1000 idle sources poll about every 15-30 s each, not at
  // random moments down to 0.1 s; and coalesced on a 250 ms grid, so the polls of the
  // sources whose waits end within a step go out in one burst (one wake-up of the
  // machine; BackoffPolicy::coalesce). Polled providers only: after a stream's
  // heartbeat the worker reads the stream again at once (the provider pushes).
  BackoffPolicy idle_backoff = [] {
    BackoffPolicy p;
    p.jitter_floor = 0.5;
    p.coalesce = absl::Milliseconds(250);
    return p;
  }();
  // Nice increment of the worker's threads (and of the provider threads they start):
  // the data plane yields to admin RPCs and health checks (base/thread_priority.h).
  int thread_nice = 5;
  // Also run them under SCHED_IDLE (UseIdleSchedulingForCurrentThread): measured admin
  // p99 under full ingest 1.58-2.52 ms over 8 runs instead of 2.7-3.0 ms, at the risk
  // described there. Off by default.
  bool thread_sched_idle = false;
  // Pages whose barrier ingest has written but whose WAL sync is still in flight, at
  // most. Ingest validates, stages and writes the next pages while the store's
  // WalSyncer syncs the earlier ones (AttemptConfig::defer_barrier_sync); a page is
  // published (progress, delivery, observers) only once synced, in order. Measured
  // (bench/HISTORY.md): the fsync of a 1000-event page takes ~3 ms here, as long as the
  // rest of the page's work; with 1 the ingest thread still waited ~2.3 ms a page for
  // it, with 2 it rarely does. Since the store paces its background syncs
  // (StoreOptions::wal_sync_interval, 5 ms), two or three pages written 2.5 ms apart
  // share one fsync; 4 lets ingest write them without waiting (with 2 it would wait for
  // the first page's fsync at the third). 0: every commit waits for its own fsync.
  int max_unsynced_pages = 4;
  // The dispatcher re-checks the gate at least this often without a poke.
  absl::Duration delivery_idle_recheck = absl::Seconds(5);
};

// True for the halted states (RESYNC_REQUIRED .. STORAGE_FAILED): the worker stopped
// and needs an operator.
bool IsHaltedState(handoff::v1::SourceState state);

// The public view of a stage's checkpoint.
handoff::v1::Checkpoint PublicCheckpoint(const store::CheckpointRecord& cp);

// Fills the checkpoint-derived fields of `progress` (checkpoint, marks, tip, lag,
// counters). Shared by the worker and the SourceManager.
void FillProgressFromCheckpoint(const store::CheckpointRecord& cp, handoff::v1::Progress* progress);

// The AttemptConfig of `stage` for a source: which sink, effect and outbox apply.
AttemptConfig MakeAttemptConfig(const handoff::v1::SourceSpec& spec, store::Stage stage,
                                store::Store* store, ExternalSink* sink,
                                TransactionalEffect* effect, EngineObserver* observer,
                                const WorkerOptions& options,
                                const std::atomic<bool>* cancelled);

class SourceWorker {
 public:
  struct Parts {
    store::Store* store = nullptr;           // not owned
    std::unique_ptr<Provider> provider;      // owned
    std::unique_ptr<ExternalSink> sink;      // owned, may be null
    TransactionalEffect* effect = nullptr;   // not owned, may be null (tests)
    EngineObserver* observer = nullptr;      // not owned, may be null
    ProgressBoard* board = nullptr;          // not owned
    // Finished page attempts are destroyed here, off the ingest thread; may be null
    // (destroyed inline). Not owned; must outlive the worker.
    DeferredDeleter* deleter = nullptr;
    // Makes the polls of this source while it is caught up, if its provider is polled
    // (Provider::PolledPerFetch); may be null (the worker polls on its own thread).
    // Shared by the workers of one provider URL: the last one to go ends its thread.
    std::shared_ptr<IdlePoller> idle_poller;
    // Persists a halt (state, reason, funding action) so it survives restarts.
    std::function<void(const handoff::v1::Progress&)> persist_halt;
  };

  SourceWorker(handoff::v1::SourceSpec spec, WorkerOptions options, Parts parts);
  ~SourceWorker();  // RequestStop + Join

  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  void RequestStop() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the threads to exit; false if `timeout` passed first.
  bool Join(absl::Duration timeout = absl::InfiniteDuration()) ABSL_LOCKS_EXCLUDED(mu_);
  // Something changed in the durable state (a hold resolved): wake and re-check now.
  void Poke() ABSL_LOCKS_EXCLUDED(mu_);
  // The store failed (Store::health()) though this worker may write nothing for hours (a
  // caught-up source, parked or reading a stream's heartbeats): it halts as
  // STORAGE_FAILED now, closing its connection, as if its own write had failed. No-op
  // once halted or stopping.
  void HaltForStoreFailure(const absl::Status& failure);

  // True once every thread has exited (stopped, halted or crashed).
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);
  // True once the worker halted (its threads are exiting or gone).
  bool halted() const { return halted_.load(); }
  // True once a stop was requested (or the worker halted): it is leaving, not running.
  bool stop_requested() const { return stop_.load(); }
  // True if a fault point abandoned the worker (tests).
  bool crashed() const { return crashed_.load(); }
  const std::string& id() const { return spec_.id(); }

 private:
  enum class Wake { kDeadline, kPoked, kStopped };

  void IngestLoop();
  // Parks this caught-up source with parts_.idle_poller, its next poll due at `at`, and
  // waits (untimed) for the first poll at `cp`'s cursor that finds more than nothing new.
  // Returns that result, or nullopt once the worker is stopping.
  std::optional<FetchResult> AwaitNews(const store::CheckpointRecord& cp,
                                       Backoff* idle_backoff, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DeliveryLoop();
  // Fills *rows (empty on entry) with the outbox entries in [from, to], decoded and in
  // order, at most `limit` of them, in rows recycled from RowPool. kDataLoss for an
  // unreadable entry.
  absl::Status ReadOutbox(Position from, Position to, size_t limit,
                          std::vector<handoff::v1::EventRow>* rows) const;
  // The next run's outbox rows, read on a helper thread while the current run is
  // delivered (the delivery thread mostly waits for the sink meanwhile), so neither the
  // lookahead call nor the next run reads the outbox in line. Used only by a run that
  // starts where the read started, under the delivery checkpoint's outbox_epoch the
  // read began under (a correction since may have rewritten them). FINALIZED gate only:
  // the rows lie at or below the finalized mark, which corrections reach only in breach
  // of the provider's contract, while below the safe mark a deep reorg is routine.
  struct RunRows {
    Position from;
    std::vector<handoff::v1::EventRow> rows;
    absl::Status status;
  };
  struct ReadAhead {
    std::future<RunRows> pending;  // valid until RowsFrom() waits for it
    std::optional<RunRows> done;
    uint64_t outbox_epoch = 0;  // of the delivery checkpoint loaded before the read
    // The rows read, up to `to`, if the read started at `from` and succeeded (waits for
    // it); else nullptr (also when none is left).
    std::vector<handoff::v1::EventRow>* RowsFrom(Position from, Position to);
  };
  // Outbox entries per delivery run (WorkerOptions::delivery_run, at least 1).
  size_t RunLimit() const { return static_cast<size_t>(std::max(1, options_.delivery_run)); }
  // Starts reading the run after `after` (at most delivery_run entries up to `to`);
  // null for a gate other than FINALIZED or when nothing follows.
  std::unique_ptr<ReadAhead> ReadRunAhead(Position after, Position to, uint64_t outbox_epoch,
                                          const UnpublishedWrites::Cap& cap) const;
  // Sends the first call of the run after `after` (outbox entries up to `to`) on a
  // helper thread: the lookahead of DeliveryLoop. Takes its rows from `ahead` when it
  // has them. Null when there is nothing to send, or when a correction has moved the
  // outbox past `outbox_epoch` (the epoch of the current run's checkpoint).
  std::unique_ptr<EarlyDelivery> SendEarly(Position after, Position to, ReadAhead* ahead,
                                           uint64_t outbox_epoch,
                                           const UnpublishedWrites::Cap& cap);
  // The run of at most delivery_run entries in [from, to]: `ahead`'s rows when it read
  // from `from` under `outbox_epoch`, else read from the outbox now. `ahead` may be null.
  absl::Status ReadRun(Position from, Position to, uint64_t outbox_epoch,
                       std::unique_ptr<ReadAhead> ahead,
                       std::vector<handoff::v1::EventRow>* rows) const;
  // Runs one attempt to its end. Returns false when the loop must exit. An ingest
  // attempt that leaves an unsynced barrier stores it in unsynced_.
  bool DriveAttempt(PageAttempt* attempt, store::Stage stage);
  // Publishes, oldest first, the unsynced pages whose sync has completed, waiting for
  // the oldest until at most `keep` remain unsynced. Publishing a page: progress,
  // observers, the fault points after its commit, a poke of the dispatcher. CANCELLED
  // when a fault point fired there (the worker is crashed), the sync's error when it
  // failed (that page and later ones are not published). Ingest thread only.
  absl::Status SettleUnsynced(size_t keep = 0);
  // SettleUnsynced, halting as STORAGE_FAILED if a sync failed. False when the worker
  // must stop (halted or crashed).
  bool SettleOrHalt(size_t keep = 0);
  // The ingest checkpoint last published (durable), else the stored one.
  absl::StatusOr<store::CheckpointRecord> PublishedIngest() const ABSL_LOCKS_EXCLUDED(mu_);
  Wake WaitUntil(absl::Time deadline, bool* poked_flag) ABSL_LOCKS_EXCLUDED(mu_);
  // A fault point fired: marks the worker crashed and stops both threads.
  void CrashAtFaultPoint();
  void SetState(handoff::v1::SourceState state, const std::string& reason,
                absl::Time retry_at = absl::InfinitePast());
  void Halt(handoff::v1::SourceState state, const std::string& reason,
            const absl::Status& error = absl::OkStatus(), const std::string& funding = "");
  void PublishCheckpoint(store::Stage stage, const store::CheckpointRecord& cp);
  void PublishAttempt(const PageAttempt* attempt);
  // Hands a finished attempt (and its page) to the deleter, or destroys it.
  void Release(std::unique_ptr<PageAttempt> attempt);
  void ThreadDone() ABSL_LOCKS_EXCLUDED(mu_);
  AttemptConfig MakeConfig(store::Stage stage);
  // A page was published: wakes the delivery stage's idle wait, and its wait on a hold
  // or a retry too if the page `rewrote_outbox` (PageAttempt::replaces_history).
  void PokeDelivery(bool rewrote_outbox) ABSL_LOCKS_EXCLUDED(mu_);
  // Ingest, before each commit: notes a step that writes outbox entries at or below the
  // highest applied position so far in unpublished_writes_.
  void NoteWriteBelowGate(const store::StepBatch& step);
  bool stopping() const { return stop_.load(); }

  // Constant after construction.
  const handoff::v1::SourceSpec spec_;
  const WorkerOptions options_;
  Parts parts_;
  const bool gated_;
  // FINALIZED gate only (else null): what the sink may have applied unrecorded, shared
  // by the two stages' attempts.
  const std::unique_ptr<UnrecordedSends> unrecorded_sends_;
  // Gated sources: the outbox writes below the delivery gate of pages not yet published.
  UnpublishedWrites unpublished_writes_;
  // Ingest thread only: the sequence number of the current page (attempt), and the
  // highest applied position any of its attempts committed.
  uint64_t ingest_page_seq_ = 0;
  std::optional<Position> applied_high_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> crashed_{false};
  std::atomic<bool> halted_{false};

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool ingest_poked_ ABSL_GUARDED_BY(mu_) = false;
  // The delivery stage's idle wait: the gate may have moved (a page published).
  bool delivery_poked_ ABSL_GUARDED_BY(mu_) = false;
  // Its wait on a hold or a retry: an operator's decision, or a published page that
  // rewrote the outbox (a correction may have replaced the waiting run's events).
  bool delivery_run_poked_ ABSL_GUARDED_BY(mu_) = false;
  // What the IdlePoller handed back to a parked ingest loop (AwaitNews).
  bool news_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<FetchResult> news_ ABSL_GUARDED_BY(mu_);
  std::optional<store::CheckpointRecord> published_ingest_ ABSL_GUARDED_BY(mu_);
  int running_threads_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;

  // Promoted pages whose barrier's sync is in flight, oldest first (at most
  // options_.max_unsynced_pages). Ingest thread only.
  std::deque<UnsyncedBarrier> unsynced_;

  std::thread ingest_thread_;
  std::thread delivery_thread_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_SOURCE_WORKER_H_
