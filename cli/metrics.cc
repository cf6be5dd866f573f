#include "cli/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/net/address.h"
#include "ferry/net/errors.h"
#include "ferry/net/system/thread_name.h"

namespace ferry::cli {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kIoTimeoutMs = 2000;

// IP:PORT (an IPv4 address; parse_host_port splits it) into `addr`.
bool parse_ipv4(const std::string& text, sockaddr_in& addr) {
  const auto hp = parse_host_port(text);
  if (!hp) return false;
  addr = {};
  addr.sin_family = AF_INET;
  char* end = nullptr;
  const long port = std::strtol(hp->port.c_str(), &end, 10);
  if (hp->port.empty() || *end != '\0' || port < 0 || port > 65535) return false;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, hp->host.c_str(), &addr.sin_addr) == 1;
}

using Clock = std::chrono::steady_clock;

// Waits until `fd` is ready for `events`; false once `deadline` has passed first (or on an
// error). The deadline bounds a whole request or response, however the peer trickles it.
bool ready_before(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

void send_all(int fd, const std::string& text) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
  size_t off = 0;
  while (off < text.size()) {
    if (!ready_before(fd, POLLOUT, deadline)) return;  // the scraper stalled past the bound
    const ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return;  // the scraper went away
    off += static_cast<size_t>(n);
  }
}

std::string response(int status, const char* reason, const std::string& body,
                     const char* type = "text/plain; charset=utf-8") {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::error_code MetricsServer::start(const std::string& address,
                                     std::function<std::string()> render, std::string& bound) {
  sockaddr_in addr;
  if (!parse_ipv4(address, addr)) return make_error_code(errc::invalid_argument);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return {errno, std::system_category()};
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    return {errno, std::system_category()};
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  char host[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr.sin_addr, host, sizeof(host));
  bound = std::string(host) + ":" + std::to_string(ntohs(addr.sin_port));
  render_ = std::move(render);
  thread_ = std::thread([this] { run(); });
  name_thread(thread_, "ferry-metrics");
  return {};
}

void MetricsServer::run() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // wakes to see stop_
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors (or memory) the connection stays queued and poll() says so again at
      // once: wait a little instead of spinning beside the transfers.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(kIoTimeoutMs);
    std::string request;
    char buf[1024];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
      if (!ready_before(fd, POLLIN, deadline)) break;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    const auto line = request.substr(0, request.find("\r\n"));
    if (line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics") {
      send_all(fd, response(200, "OK", render_(), "text/plain; version=0.0.4; charset=utf-8"));
    } else if (line.rfind("GET ", 0) == 0) {
      send_all(fd, response(404, "Not Found", "ferry serves its metrics at /metrics\n"));
    } else if (!line.empty()) {
      send_all(fd, response(405, "Method Not Allowed", "GET /metrics\n"));
    }
    ::close(fd);
  }
}

}  // namespace ferry::cli
