// IdlePoller: makes the polls of caught-up polling sources on one shared thread, so that
// a source with nothing new upstream does not wake its own worker thread for each poll.
//
// Why: 1000 caught-up polling sources poll ~44 times a second in all. On this kind of VM
// waking a sleeping thread costs ~55-70 us of CPU on its own (a timed futex wait and its
// wake, measured with no work at all), and the worker's own steps around a poll touch a
// cold stack, attempt and checkpoint: 310-570 us of process CPU a poll with one thread
// per source, against ~60 us for the same Fetch made by one thread in bursts
// (idle_poll_bench). The poller sleeps until the earliest parked deadline and polls every
// source due then, one after the other.
//
// Protocol: a worker whose poll found nothing new Parks a ParkedPoll (its provider, the
// committed cursor, its idle Backoff and the deadline of its next poll) and waits
// untimed for on_result. The poller, at or after the deadline, calls
// provider->Fetch(cursor): a page that ParkedPoll::nothing_new accepts (the worker's own
// verdict: the contract's empty page whose `next` is the cursor, passed by the page
// validator) is dropped, the next deadline taken from the Backoff and reported through
// on_nothing_new; anything else (a page with items, a moved cursor, a page the validator
// would refuse, a refusal, a cancellation) goes to on_result as it came, and the source
// leaves the poller. The worker then handles that FetchResult exactly as one it fetched
// itself.
//
// Invariants:
// - While parked, a source's provider and backoff are used by the poller thread only;
//   after Unpark returns, never again (Unpark waits out a Fetch in flight, which the
//   worker's RequestStop cancels through Provider::Cancel).
// - on_result is called at most once per Park, on the poller thread, and never after
//   Unpark returned. on_nothing_new likewise.
// - No page is applied here: the poller only recognises "nothing new", which applying
//   would leave unchanged (no checkpoint, receipt or row is read or written).
//
// A Fetch that hangs (a provider that accepts and never answers) delays the other parked
// sources' polls until its timeouts (HttpProviderOptions: connect, read, response) end it;
// its refusal then sends that source back to its worker's own backoff. So that this
// stays within one provider, SourceManagerImpl keeps one IdlePoller per provider URL.
//
// Thread-safe.
#ifndef HANDOFF_CONSUMER_IDLE_POLLER_H_
#define HANDOFF_CONSUMER_IDLE_POLLER_H_

#include <functional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "consumer/backoff.h"
#include "consumer/page.h"
#include "consumer/provider.h"

namespace handoff::consumer {

// One parked source. Owned by its worker, which keeps it alive from Park to Unpark.
struct ParkedPoll {
  Provider* provider = nullptr;  // not owned
  std::string cursor;            // the committed cursor polled
  Backoff* backoff = nullptr;    // not owned: the deadline after each nothing-new poll
  absl::Time at;                 // the next poll's deadline
  // True for a page the worker would apply as "nothing new yet" (a no-op) without
  // reading storage. Called on the poller thread while parked.
  std::function<bool(const Page&)> nothing_new;
  // After a nothing-new poll, with the next deadline (the worker's progress shows it).
  std::function<void(absl::Time next)> on_nothing_new;
  // Any other result; the source is no longer parked.
  std::function<void(FetchResult)> on_result;
};

class IdlePoller {
 public:
  // The thread runs `thread_nice` above its creator's nice value (polls are data-plane
  // work, as the workers' are).
  explicit IdlePoller(int thread_nice = 0);
  ~IdlePoller();  // every worker must have Unparked

  IdlePoller(const IdlePoller&) = delete;
  IdlePoller& operator=(const IdlePoller&) = delete;

  // Polls `p` from p->at on. `p` must not be parked already.
  void Park(ParkedPoll* p) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `p` out (a no-op once on_result was called), waiting while its Fetch is in
  // flight. After it returns the poller no longer touches `p` or its provider.
  void Unpark(ParkedPoll* p) ABSL_LOCKS_EXCLUDED(mu_);

  // Sources parked now (tests, metrics).
  size_t parked() const ABSL_LOCKS_EXCLUDED(mu_);
  // Polls made that found nothing new (tests, metrics).
  int64_t idle_polls() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const int thread_nice_;
  mutable absl::Mutex mu_;
  // Ordered by deadline; the pointer breaks ties.
  absl::CondVar cv_;
  std::set<std::pair<absl::Time, ParkedPoll*>> due_ ABSL_GUARDED_BY(mu_);
  ParkedPoll* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Set by Unpark while its source's Fetch is in flight: not parked again after it.
  bool in_flight_unparked_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t idle_polls_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_IDLE_POLLER_H_
