#include "base/thread_name.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace handoff {

std::string ThreadName(absl::string_view role, absl::string_view id) {
  std::string name = absl::StrCat(role, ":", id);
  if (name.size() > kMaxThreadNameBytes) {
    name.resize(kMaxThreadNameBytes - 1);
    name.push_back('~');
  }
  return name;
}

absl::Status NameCurrentThread(absl::string_view name) {
  if (name.size() > kMaxThreadNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("thread name '", name, "' is longer than ",
                                                   kMaxThreadNameBytes, " bytes"));
  }
  const std::string copy(name);
  const int err = pthread_setname_np(pthread_self(), copy.c_str());
  if (err != 0) {
    return absl::InternalError(absl::StrCat("pthread_setname_np: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

std::string CurrentThreadName() {
  char buf[kMaxThreadNameBytes + 1] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return "";
  return buf;
}

pid_t CurrentThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

std::vector<ThreadInfo> ListThreads() {
  namespace fs = std::filesystem;
  std::vector<ThreadInfo> threads;
  std::error_code error;
  for (fs::directory_iterator it("/proc/self/task", error), end; !error && it != end;
       it.increment(error)) {
    std::ifstream comm(it->path() / "comm");
    ThreadInfo thread;
    // A thread that ended since the listing has no name left to read.
    if (!std::getline(comm, thread.name)) continue;
    if (!absl::SimpleAtoi(it->path().filename().string(), &thread.id)) continue;
    threads.push_back(std::move(thread));
  }
  return threads;
}

std::vector<pid_t> ThreadsNamed(absl::string_view name) {
  std::vector<pid_t> ids;
  for (const ThreadInfo& thread : ListThreads()) {
    if (thread.name == name) ids.push_back(thread.id);
  }
  return ids;
}

}  // namespace handoff
