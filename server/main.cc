// handoffd: flags -> ServerOptions -> Server::BuildAndStart -> WaitForTermination.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "base/heap_retention.h"
#include "server/flags.h"
#include "server/server.h"

ABSL_FLAG(bool, debug_mutex_deadlock_detection, false,
          "Check every absl::Mutex acquisition against a global lock graph (abort on a "
          "potential deadlock). Debian's abseil enables this by default; it costs CPU on "
          "every lock, so production turns it off. The test suite keeps it on.");

int main(int argc, char** argv) {
  // Before any thread starts: memtable arenas and page buffers are reused, not faulted
  // in again for every memtable and page (base/heap_retention.h).
  const absl::Status heap = handoff::RetainFreedHeapMemory();
  absl::SetProgramUsageMessage(
      "handoffd: crash-safe consumer of ordered, paginated event feeds.\n"
      "  handoffd --data_dir=DIR (--auth_tokens_file=FILE | --insecure_disable_auth) ...");
  absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::GetFlag(FLAGS_debug_mutex_deadlock_detection)
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);

  if (!heap.ok()) {
    const std::string message(heap.message());
    std::fprintf(stderr,
                 "{\"level\":\"warn\",\"msg\":\"allocator defaults kept\",\"error\":%s}\n",
                 handoff::server::JsonQuote(message).c_str());
  }
  absl::StatusOr<handoff::server::ServerOptions> options = handoff::server::OptionsFromFlags();
  if (!options.ok()) {
    const std::string message(options.status().message());
    std::fprintf(stderr, "{\"level\":\"error\",\"msg\":\"bad flags\",\"error\":%s}\n",
                 handoff::server::JsonQuote(message).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<handoff::server::Server>> server =
      handoff::server::Server::BuildAndStart(*std::move(options));
  if (!server.ok()) return 1;  // already logged
  (*server)->WaitForTermination();
  if (!(*server)->abandoned_sources().empty()) {
    // Workers that did not stop within --shutdown_grace still run and use the store:
    // end the process without destroying it under them (server.h). Logged already.
    std::fflush(nullptr);
    std::_Exit(1);
  }
  return 0;
}
