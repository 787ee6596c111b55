// Test-only: drop a capability from the calling thread, to exercise the paths a process
// without a privilege takes (base/thread_priority.h's PERMISSION_DENIED) when the tests
// themselves run as root, as CI does.
//
// Linux keeps capabilities per thread and a new thread inherits its creator's, so run the
// code under test on the thread that dropped it (or on threads it starts), and never on
// a thread other tests reuse: the capability cannot be taken back.
#ifndef HANDOFF_BASE_CAPABILITIES_FOR_TESTING_H_
#define HANDOFF_BASE_CAPABILITIES_FOR_TESTING_H_

#include "absl/status/status.h"

namespace handoff {

// Removes `capability` (a CAP_* number from <linux/capability.h>) from the calling
// thread's effective, permitted and inheritable sets.
absl::Status DropCapabilityFromCurrentThread(int capability);

}  // namespace handoff

#endif  // HANDOFF_BASE_CAPABILITIES_FOR_TESTING_H_
