// Termination signals (SIGTERM from Kubernetes, SIGINT from a terminal) turned into a
// callback on a thread of their own, so shutdown runs as ordinary code rather than in a
// signal handler.
//
// BlockTerminationSignals() must run before the process starts any thread (threads
// inherit the mask); then no thread is interrupted and the watcher's sigwait() is the
// only receiver. Thread-compatible: construct and destroy on one thread.
#ifndef HANDOFF_SERVER_SIGNALS_H_
#define HANDOFF_SERVER_SIGNALS_H_

#include <atomic>
#include <functional>
#include <thread>

namespace handoff::server {

// Blocks SIGTERM and SIGINT in the calling thread and the threads it creates later.
void BlockTerminationSignals();

class SignalWatcher {
 public:
  // Calls `on_signal(signo)` (on the watcher thread) for the first SIGTERM or SIGINT.
  explicit SignalWatcher(std::function<void(int)> on_signal);
  // Wakes the watcher if it still waits, and joins it. The callback is not called for
  // that wake-up.
  ~SignalWatcher();

  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_SIGNALS_H_
