// ScriptedServer: a tiny raw-TCP HTTP server for hostile-provider tests. Each accepted
// connection reads the request head and then hands the socket to a script that writes
// whatever bytes it likes (malformed status lines, header floods, endless bodies, a byte
// at a time). Pacing inside a script uses Pause(), which returns early (false) when the
// server stops, so Stop() never waits for a trickle to end.
//
// Thread-safe. Binds 127.0.0.1 on port 0.
#ifndef HANDOFF_TESTS_HOSTILE_SCRIPTED_SERVER_H_
#define HANDOFF_TESTS_HOSTILE_SCRIPTED_SERVER_H_

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace handoff::tests {

class ScriptedServer {
 public:
  class Conn {
   public:
    Conn(int fd, ScriptedServer* server) : fd_(fd), server_(server) {}
    // False once the peer has gone (or the server stops).
    bool Send(absl::string_view bytes);
    // Waits `d` unless the server stops first (then false).
    bool Pause(absl::Duration d);
    const std::string& request() const { return request_; }

   private:
    friend class ScriptedServer;
    int fd_;
    ScriptedServer* server_;
    std::string request_;
  };
  using Script = std::function<void(Conn& conn)>;

  explicit ScriptedServer(Script script);
  ~ScriptedServer();  // Stop()

  int port() const { return port_; }
  std::string base_url() const;
  int connections() const { return connections_.load(); }
  // Request heads seen so far.
  std::vector<std::string> requests() const ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void AcceptLoop();
  void Serve(int fd);

  const Script script_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> connections_{0};
  absl::Notification stopping_;
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// "HTTP/1.1 <status>\r\n" + headers + Content-Length (when body_length >= 0) +
// "Connection: close\r\n\r\n".
std::string ResponseHead(absl::string_view status, absl::string_view content_type,
                         long long body_length, absl::string_view extra_headers = "");

}  // namespace handoff::tests

#endif  // HANDOFF_TESTS_HOSTILE_SCRIPTED_SERVER_H_
