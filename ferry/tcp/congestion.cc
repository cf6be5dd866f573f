#include "ferry/tcp/congestion.h"

#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include <boost/asio/ip/tcp.hpp>

#include "ferry/net/log.h"

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
        "(TcpOptions::congestion, $FERRY_TCP_CONGESTION)",
        algorithm, why);
  } else {
    FERRY_LOG_DEBUG("TCP data channel: congestion control '{}' refused ({})", algorithm, why);
  }
}

// The address getsockname or getpeername gives `fd` (Asio's endpoint decodes the sockaddr).
std::optional<boost::asio::ip::address> address_of(int fd, int (*get)(int, sockaddr*, socklen_t*)) {
  boost::asio::ip::tcp::endpoint endpoint;
  socklen_t len = static_cast<socklen_t>(endpoint.capacity());
  if (get(fd, endpoint.data(), &len) != 0) return std::nullopt;
  if (len > endpoint.capacity()) return std::nullopt;  // not IPv4 or IPv6
  endpoint.resize(len);
  return endpoint.address();
}

}  // namespace

bool same_host(const boost::asio::ip::address& local, const boost::asio::ip::address& remote) {
  return remote.is_loopback() || local == remote;
}

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
  if (had == kOneHostCongestion) return had;  // no address to look up
  const auto local = address_of(fd, ::getsockname);
  const auto remote = address_of(fd, ::getpeername);
  if (!local || !remote || !same_host(*local, *remote)) return had;
  if (int err = set(fd, kOneHostCongestion)) {
    report_refusal(kOneHostCongestion, err);
    return had;
  }
  FERRY_LOG_DEBUG("TCP data channel to {}: congestion control {} instead of {} (one host)",
                  remote->to_string(), kOneHostCongestion, had);
  return current(fd);
}

}  // namespace ferry::tcp
