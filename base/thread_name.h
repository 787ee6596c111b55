// Names of Handoff's own threads, as `top -H`, `ps -L`, perf and gdb show them.
//
// Threads started by a thread inherit its name, so without this every source worker
// would carry the name of whatever started it (a gRPC handler: "grpcpp_sync_ser"), and
// an operator could not tell a busy source's threads from the admin API's. Each source's
// worker threads are named for their role and the source (consumer/source_worker.cc:
// "in" ingests, "dl" delivers); the threads they start (the poll prefetch, the SSE
// reader, delivery helpers) inherit that name. The store's WAL syncer is "wal-sync".
//
// Linux keeps at most 15 bytes of a thread's name: ThreadName keeps the role and as much
// of the id as fits, its end replaced by '~' when it does not.
#ifndef HANDOFF_BASE_THREAD_NAME_H_
#define HANDOFF_BASE_THREAD_NAME_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace handoff {

// The longest thread name Linux keeps.
inline constexpr size_t kMaxThreadNameBytes = 15;

// "<role>:<id>", cut to kMaxThreadNameBytes with a trailing '~' when cut.
std::string ThreadName(absl::string_view role, absl::string_view id);

// Names the calling thread `name` (at most kMaxThreadNameBytes: longer is
// INVALID_ARGUMENT and the name is left as it was).
absl::Status NameCurrentThread(absl::string_view name);

// The calling thread's name.
std::string CurrentThreadName();

// The calling thread's id (the kernel's thread id, as `ps -L` shows it).
pid_t CurrentThreadId();

// One thread of this process.
struct ThreadInfo {
  pid_t id = 0;
  std::string name;
};

// This process's threads, as /proc/self/task lists them now (a thread that starts or
// ends meanwhile may be missed or listed). For finding a library's threads, which only
// their names tell apart.
std::vector<ThreadInfo> ListThreads();

// The ids of the threads ListThreads finds named exactly `name`.
std::vector<pid_t> ThreadsNamed(absl::string_view name);

}  // namespace handoff

#endif  // HANDOFF_BASE_THREAD_NAME_H_
