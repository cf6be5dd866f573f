#include "tcp/congestion.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include "net/log.h"

namespace ferry::tcp {
namespace {

std::string current(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name) - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return {};
  return std::string(name, ::strnlen(name, len));
}

// 0, or the errno of the kernel's refusal.
int set(int fd, const std::string& algorithm) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(),
                   static_cast<socklen_t>(algorithm.size())) == 0) {
    return 0;
  }
  return errno;
}

void report_refusal(const std::string& algorithm, int err) {
  static std::atomic<bool> warned{false};
  const auto why = std::error_code(err, std::system_category()).message();
  if (!warned.exchange(true)) {
    FERRY_LOG_WARN(
        "TCP data channel: congestion control '{}' refused ({}); the system's default stays "
        "(ContextOptions::tcp_congestion)",
        algorithm, why);
  } else {
    FERRY_LOG_DEBUG("TCP data channel: congestion control '{}' refused ({})", algorithm, why);
  }
}

// The address getsockname or getpeername gives `fd`, if it is IPv4 or IPv6.
std::optional<boost::asio::ip::address> address_of(int fd, int (*get)(int, sockaddr*, socklen_t*)) {
  sockaddr_storage s{};
  socklen_t len = sizeof(s);
  if (get(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return std::nullopt;
  if (s.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(s);
    return boost::asio::ip::address_v4(ntohl(in.sin_addr.s_addr));
  }
  if (s.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(s);
    boost::asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), in6.sin6_addr.s6_addr, bytes.size());
    return boost::asio::ip::address_v6(bytes);
  }
  return std::nullopt;
}

}  // namespace

bool same_host(const boost::asio::ip::address& local, const boost::asio::ip::address& remote) {
  return remote.is_loopback() || local == remote;
}

bool paces(const std::string& algorithm) { return algorithm.rfind("bbr", 0) == 0; }

std::string tune_congestion(int fd, const std::string& option) {
  const std::string had = current(fd);
  if (option == "system") return had;
  if (!option.empty()) {
    if (option == had) return had;
    if (int err = set(fd, option)) {
      report_refusal(option, err);
      return had;
    }
    return current(fd);
  }
  const auto local = address_of(fd, ::getsockname);
  const auto remote = address_of(fd, ::getpeername);
  if (!local || !remote || !paces(had) || !same_host(*local, *remote)) return had;
  int err = 0;
  for (const char* algorithm : {"cubic", "reno"}) {
    if ((err = set(fd, algorithm)) == 0) {
      FERRY_LOG_DEBUG("TCP data channel to {}: congestion control {} instead of {} (one host)",
                      remote->to_string(), algorithm, had);
      return current(fd);
    }
  }
  report_refusal("cubic", err);
  return had;
}

}  // namespace ferry::tcp
