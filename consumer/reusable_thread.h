// ReusableThread: runs one task at a time on a thread kept between tasks.
//
// The polling provider fetches and parses the next page on another thread while the
// current page commits. Creating and joining a thread for every page cost the ingest
// path ~0.7 ms per page on two busy cores (the new thread's start, measured from the
// request to its first instruction) and made every fetch start with cold allocator
// caches; this keeps the thread instead.
//
// Invariants:
//  - At most one task at a time: Run() requires that the previous task was waited for.
//  - Everything a task wrote happens-before the Wait() that observes its end.
//  - The thread ends after `idle_exit` without a task, so an owner that stopped handing
//    out work (a caught-up source) holds no thread; the next Run() starts a new one.
//  - The destructor waits for the task in flight, then ends the thread.
//
// Run(), Wait() and the destructor are called by one owning thread (thread-compatible);
// the pool thread is internal.
#ifndef HANDOFF_CONSUMER_REUSABLE_THREAD_H_
#define HANDOFF_CONSUMER_REUSABLE_THREAD_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace handoff::consumer {

class ReusableThread {
 public:
  explicit ReusableThread(absl::Duration idle_exit = absl::Seconds(1));
  ~ReusableThread();
  ReusableThread(const ReusableThread&) = delete;
  ReusableThread& operator=(const ReusableThread&) = delete;

  // Starts `task` on the thread (starting the thread if it ended).
  // REQUIRES: !busy().
  void Run(absl::AnyInvocable<void() &&> task);

  // Whether a task was Run() and not yet waited for.
  bool busy() const;

  // Waits for the task started by Run() to finish; returns at once when !busy().
  void Wait();

  // Threads started so far, and whether one is running now (tests).
  int threads_started() const;
  bool thread_alive() const;

 private:
  void Main();

  const absl::Duration idle_exit_;
  mutable absl::Mutex mu_;
  absl::AnyInvocable<void() &&> task_ ABSL_GUARDED_BY(mu_);
  bool task_ready_ ABSL_GUARDED_BY(mu_) = false;  // Run() handed a task over
  bool busy_ ABSL_GUARDED_BY(mu_) = false;        // Run() and no Wait() yet
  bool finished_ ABSL_GUARDED_BY(mu_) = false;    // the task handed over has returned
  bool alive_ ABSL_GUARDED_BY(mu_) = false;       // the thread is in Main()
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int threads_started_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // owner thread only
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_REUSABLE_THREAD_H_
