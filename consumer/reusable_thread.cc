#include "consumer/reusable_thread.h"

#include <cassert>
#include <utility>


namespace handoff::consumer {

ReusableThread::ReusableThread(absl::Duration idle_exit) : idle_exit_(idle_exit) {}

ReusableThread::~ReusableThread() {
  Wait();
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ReusableThread::Run(absl::AnyInvocable<void() &&> task) {
  bool start = false;
  {
    absl::MutexLock lock(&mu_);
    assert(!busy_ && "ReusableThread::Run while a task is outstanding");
    task_ = std::move(task);
    task_ready_ = true;
    busy_ = true;
    finished_ = false;
    if (!alive_) {
      alive_ = true;
      ++threads_started_;
      start = true;
    }
  }
  if (start) {
    // The previous thread, if any, has left Main() (it cleared alive_ under the lock as
    // its last step), so this join does not wait on anything.
    if (thread_.joinable()) thread_.join();
    thread_ = std::thread([this] { Main(); });
  }
}

bool ReusableThread::busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

void ReusableThread::Wait() {
  absl::MutexLock lock(&mu_);
  if (!busy_) return;
  mu_.Await(absl::Condition(&finished_));
  busy_ = false;
}

int ReusableThread::threads_started() const {
  absl::MutexLock lock(&mu_);
  return threads_started_;
}

bool ReusableThread::thread_alive() const {
  absl::MutexLock lock(&mu_);
  return alive_;
}

void ReusableThread::Main() {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return task_ready_ || shutdown_;
  };
  while (true) {
    if (!mu_.AwaitWithTimeout(absl::Condition(&has_work), idle_exit_) || !task_ready_) {
      // Idle for idle_exit_, or shutting down with no task: a later Run() starts a new
      // thread (it sees alive_ == false).
      alive_ = false;
      return;
    }
    absl::AnyInvocable<void() &&> task = std::move(task_);
    task_ready_ = false;
    mu_.Unlock();
    std::move(task)();
    mu_.Lock();
    finished_ = true;
  }
}

}  // namespace handoff::consumer
