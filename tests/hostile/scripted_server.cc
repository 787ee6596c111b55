#include "tests/hostile/scripted_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"

namespace handoff::tests {

bool ScriptedServer::Conn::Send(absl::string_view bytes) {
  while (!bytes.empty()) {
    if (server_->stopping_.HasBeenNotified()) return false;
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool ScriptedServer::Conn::Pause(absl::Duration d) {
  return !server_->stopping_.WaitForNotificationWithTimeout(d);
}

ScriptedServer::ScriptedServer(Script script) : script_(std::move(script)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    return;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ScriptedServer::~ScriptedServer() { Stop(); }

std::string ScriptedServer::base_url() const { return absl::StrCat("http://127.0.0.1:", port_); }

std::vector<std::string> ScriptedServer::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

void ScriptedServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!stopping_.HasBeenNotified()) stopping_.Notify();
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  for (std::thread& t : workers) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void ScriptedServer::AcceptLoop() {
  while (!stopping_.HasBeenNotified()) {
    pollfd p{listen_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, 100);  // re-checks the stop flag; accept wakes it otherwise
    if (r <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      ::close(fd);
      return;
    }
    connections_.fetch_add(1);
    open_fds_.push_back(fd);
    workers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void ScriptedServer::Serve(int fd) {
  Conn conn(fd, this);
  char buf[4096];
  while (conn.request_.find("\r\n\r\n") == std::string::npos && conn.request_.size() < 65536) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    conn.request_.append(buf, static_cast<size_t>(n));
  }
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(conn.request_);
  }
  if (conn.request_.find("\r\n\r\n") != std::string::npos) script_(conn);
  ::shutdown(fd, SHUT_WR);
  {
    absl::MutexLock lock(&mu_);
    open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  }
  ::close(fd);
}

std::string ResponseHead(absl::string_view status, absl::string_view content_type,
                         long long body_length, absl::string_view extra_headers) {
  std::string head = absl::StrCat("HTTP/1.1 ", status, "\r\n");
  if (!content_type.empty()) absl::StrAppend(&head, "Content-Type: ", content_type, "\r\n");
  if (body_length >= 0) absl::StrAppend(&head, "Content-Length: ", body_length, "\r\n");
  absl::StrAppend(&head, extra_headers, "Connection: close\r\n\r\n");
  return head;
}

}  // namespace handoff::tests
