// ThreadSanitizer shim for Debian's uninstrumented abseil (--config=tsan only).
//
// libabsl_synchronization.so is not built with -fsanitize=thread, so absl::Mutex's lock
// and unlock are plain atomics TSan never sees: every access guarded by an absl::Mutex
// would be reported as a data race. This file interposes the out-of-line Mutex and
// CondVar entry points (the test executable's definitions win over the shared library's
// for every caller, including grpc and abseil itself), forwards to the real ones
// (dlsym RTLD_NEXT) and tells TSan about the happens-before edges: release on the
// mutex's address before it is given up, acquire after it is taken. It adds no locking
// of its own. Linked into every binary by .bazelrc's build:tsan --custom_malloc.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace {

void* Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found\n", mangled);
    std::abort();
  }
  return f;
}

#define HANDOFF_REAL(type, mangled) \
  static const auto real = reinterpret_cast<type>(Real(mangled))

extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);

inline void Acquire(const void* mu) { __tsan_acquire(const_cast<void*>(mu)); }
inline void Release(const void* mu) { __tsan_release(const_cast<void*>(mu)); }

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  HANDOFF_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  HANDOFF_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}

bool Mutex::TryLock() {
  HANDOFF_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  HANDOFF_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  HANDOFF_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  HANDOFF_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::LockWhen(const Condition& cond) {
  HANDOFF_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  HANDOFF_REAL(void (*)(Mutex*, const Condition&),
               "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquire(this);
}

// The *WithTimeout/*WithDeadline forms hold the mutex on return whatever they return.
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  HANDOFF_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool r = real(this, cond, timeout);
  Acquire(this);
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  HANDOFF_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool r = real(this, cond, deadline);
  Acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  HANDOFF_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool r = real(this, cond, timeout);
  Acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  HANDOFF_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool r = real(this, cond, deadline);
  Acquire(this);
  return r;
}

// absl evaluates a Condition while it holds the mutex, but inside its own lock/unlock
// paths (after Unlock's release above, or in another thread on a waiter's behalf), so
// TSan would order the condition's reads wrongly. Conditions only read mutex-guarded
// state; their reads are not checked.
bool Condition::Eval() const {
  HANDOFF_REAL(bool (*)(const Condition*), "_ZNK4absl7debian39Condition4EvalEv");
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  const bool r = real(this);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  return r;
}

// Await* and CondVar::Wait* give the mutex up while waiting and hold it again on return.
void Mutex::Await(const Condition& cond) {
  HANDOFF_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  real(this, cond);
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  HANDOFF_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  const bool r = real(this, cond, timeout);
  Acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  HANDOFF_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  const bool r = real(this, cond, deadline);
  Acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  HANDOFF_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  HANDOFF_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
               "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool r = real(this, mu, timeout);
  Acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  HANDOFF_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
               "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool r = real(this, mu, deadline);
  Acquire(mu);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
