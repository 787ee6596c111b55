#include "server/signals.h"

#include <pthread.h>
#include <signal.h>

#include <utility>

namespace handoff::server {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) {
  // The watcher inherits the mask: blocked signals are only ever taken by sigwait.
  BlockTerminationSignals();
  thread_ = std::thread([this, on_signal = std::move(on_signal)] {
    const sigset_t set = TerminationSet();
    int signo = 0;
    while (sigwait(&set, &signo) != 0) {
    }
    if (!stopping_.load()) on_signal(signo);
  });
}

SignalWatcher::~SignalWatcher() {
  stopping_.store(true);
  // A thread-directed SIGTERM, blocked everywhere, is consumed by the watcher's sigwait.
  // If the watcher already returned, the signal stays pending on a finished thread.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

}  // namespace handoff::server
