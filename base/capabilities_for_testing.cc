#include "base/capabilities_for_testing.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace handoff {

absl::Status DropCapabilityFromCurrentThread(int capability) {
  if (capability < 0 || capability >= 64) {
    return absl::InvalidArgumentError(absl::StrCat("no capability ", capability));
  }
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;  // the calling thread
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) {
    return absl::InternalError(absl::StrCat("capget: ", std::strerror(errno)));
  }
  const uint32_t bit = 1u << (capability % 32);
  __user_cap_data_struct& word = data[capability / 32];
  word.effective &= ~bit;
  word.permitted &= ~bit;
  word.inheritable &= ~bit;
  if (syscall(SYS_capset, &header, data) != 0) {
    return absl::InternalError(absl::StrCat("capset: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace handoff
