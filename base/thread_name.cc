#include "base/thread_name.h"

#include <pthread.h>

#include <cerrno>
#include <cstring>

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

}  // namespace handoff
