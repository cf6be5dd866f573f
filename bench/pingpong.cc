#include "bench/pingpong.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/measure.h"
#include "ferry/tcp/congestion.h"
#include "ferry/tcp/options.h"

namespace ferry::bench {
namespace {

constexpr uint64_t kMaxSize = 1ull << 30;

bool parse_address(const std::string& text, sockaddr_in& addr) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(text.c_str() + colon + 1)));
  return inet_pton(AF_INET, text.substr(0, colon).c_str(), &addr.sin_addr) == 1;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = ::send(fd, b, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A connected socket set up as ferry sets up its data channels: TCP_NODELAY, and the congestion
// control TcpOptions::congestion would give it ($FERRY_TCP_CONGESTION as ferry reads it).
void like_a_data_channel(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  tcp::tune_congestion(fd, tcp::TcpOptions::from_environment().congestion);
}

}  // namespace

int run_pingpong_serve(const PingPongArgs& args) {
  sockaddr_in addr;
  if (!parse_address(args.address, addr)) {
    std::fprintf(stderr, "pingpong-serve: bad address '%s'\n", args.address.c_str());
    return 2;
  }
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(ls, 4) != 0) {
    std::perror("pingpong-serve: bind/listen");
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len);
  char host[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr.sin_addr, host, sizeof(host));
  std::printf("ready %s:%u\n", host, ntohs(addr.sin_port));
  std::fflush(stdout);
  std::vector<char> data;
  for (;;) {
    int fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    like_a_data_channel(fd);
    uint64_t want = 0;
    while (read_all(fd, &want, sizeof(want)) && want <= kMaxSize) {
      if (data.size() < want) data.resize(want, 'x');
      if (!write_all(fd, data.data(), want)) break;
    }
    ::close(fd);
  }
}

int run_pingpong(const PingPongArgs& args) {
  sockaddr_in addr;
  if (!parse_address(args.address, addr) || args.size > kMaxSize) {
    std::fprintf(stderr, "pingpong: bad address '%s' or size\n", args.address.c_str());
    return 2;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("pingpong: connect");
    return 1;
  }
  like_a_data_channel(fd);
  // One landing buffer per answer in flight: the working set of a fetch window of as many
  // preallocated targets.
  const uint64_t inflight = std::max<uint64_t>(1, args.inflight);
  std::vector<std::vector<char>> bufs(inflight, std::vector<char>(args.size));
  for (auto& b : bufs) std::memset(b.data(), 0, b.size());  // touched before the clock starts
  const uint64_t want = args.size;
  for (uint64_t i = 1; i < inflight; ++i) {
    if (!write_all(fd, &want, sizeof(want))) return 1;
  }
  std::vector<double> rtts;
  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(args.warmup));
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(args.seconds));
  const double cpu0 = self_cpu_seconds();
  double cpu_from = cpu0;
  Clock::time_point t = start;
  bool measuring = false;
  // The request for answer k + inflight - 1 goes out before answer k is read, so inflight
  // answers are asked for at any time. With one in flight each sample is a round trip.
  for (uint64_t k = 0; t < end; ++k) {
    if (!measuring && t >= measure_from) {
      measuring = true;
      cpu_from = self_cpu_seconds();
    }
    auto& buf = bufs[k % inflight];
    if (!write_all(fd, &want, sizeof(want)) || !read_all(fd, buf.data(), buf.size())) {
      std::fprintf(stderr, "pingpong: the server went away\n");
      return 1;
    }
    const auto now = Clock::now();
    if (measuring) rtts.push_back(std::chrono::duration<double, std::micro>(now - t).count());
    t = now;
  }
  ::close(fd);
  const double secs = seconds_between(measure_from, t);
  const double cpu = self_cpu_seconds() - cpu_from;
  const double bytes = static_cast<double>(rtts.size()) * static_cast<double>(args.size);
  const uint64_t n = rtts.size();
  JsonLine out;
  out.add("tool", "pingpong")
      .add("size", args.size)
      .add("inflight", inflight)
      .add("fetches", n)
      .add("seconds", secs)
      .add("gbps", bytes / secs / 1e9)
      .add("fetches_per_s", static_cast<double>(n) / secs)
      .add("p50_us", quantile(rtts, 0.5))
      .add("p99_us", quantile(rtts, 0.99))
      .add("cpu_client_s", cpu);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace ferry::bench
