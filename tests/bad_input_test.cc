// Bad input on the metadata port: every case gets a clear error (or the connection is closed
// with one), and an honest client fetching throughout never sees an error.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "ferry/net/frame.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/security/attach.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// A blocking client that speaks raw frames, with a receive timeout on every read.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address(test_host()), port));
  }
  void send_raw(std::string_view bytes) { asio::write(socket_, asio::buffer(bytes)); }
  void send(const wire::Envelope& env) { send_raw(encode_frame(env)); }
  void shutdown_send() { socket_.shutdown(tcp::socket::shutdown_send); }

  // Next frame, or nullopt on EOF / error / 5 s without it.
  std::optional<wire::Envelope> read() {
    unsigned char h[4];
    if (!read_exactly(h, 4)) return std::nullopt;
    uint32_t len = (uint32_t{h[0]} << 24) | (uint32_t{h[1]} << 16) | (uint32_t{h[2]} << 8) | h[3];
    if (len > (16u << 20)) return std::nullopt;
    std::string body(len, '\0');
    if (!read_exactly(body.data(), len)) return std::nullopt;
    wire::Envelope env;
    if (!env.ParseFromString(body)) return std::nullopt;
    return env;
  }
  // True when the server closed the connection (EOF or reset) within 10 s; frames it still
  // sends before closing are skipped.
  bool closed_by_server() {
    char buf[4096];
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{socket_.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(socket_.native_handle(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }

  // Hello + HelloAnswer; returns the answer (or nullopt).
  std::optional<wire::Envelope> handshake(uint32_t version = kProtocolVersion) {
    wire::Envelope env;
    auto* hello = env.mutable_hello();
    hello->set_protocol_version(version);
    hello->set_name("raw");
    hello->add_transports()->set_name("TCP");
    send(env);
    return read();
  }

 private:
  // Reads `n` bytes with a 5 s deadline (poll): a server that goes quiet fails the read.
  bool read_exactly(void* dst, size_t n) {
    auto* p = static_cast<char*>(dst);
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (n > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{socket_.native_handle(), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      ssize_t got = ::recv(socket_.native_handle(), p, n, MSG_DONTWAIT);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }

  asio::io_context io_;
  tcp::socket socket_;
};

struct BadInput : ::testing::Test {
  void SetUp() override {
    bytes = make_pattern(3u << 20, 77);
    ref = server.put(bytes);
    honest_peer = connect_or_fail(honest_ctx, server.address());
    honest = std::thread([this] {
      while (!stop) {
        auto req = honest_peer.fetch(ref);
        auto ec = req.wait(scaled(20s));
        if (ec || !same_bytes(req.result().tensors[0], *bytes)) {
          ++honest_errors;
        } else {
          ++honest_fetches;
          std::lock_guard lock(done_mu);
          done_at.push_back(std::chrono::steady_clock::now());
        }
      }
    });
  }
  void TearDown() override {
    // Let the honest client keep going for a moment after the last bad input.
    std::this_thread::sleep_for(100ms);
    stop = true;
    honest.join();
    EXPECT_EQ(honest_errors, 0) << "the honest client saw errors";
    EXPECT_GT(honest_fetches, 0);
  }
  static void expect_error(const std::optional<wire::Envelope>& env, errc code) {
    ASSERT_TRUE(env.has_value()) << "no error frame before close";
    ASSERT_TRUE(env->has_error()) << env->DebugString();
    EXPECT_EQ(env->error().code(), static_cast<uint32_t>(code));
    EXPECT_FALSE(env->error().message().empty());
  }

  Server server;
  std::shared_ptr<std::vector<std::byte>> bytes;
  ObjectRef ref;
  Context honest_ctx{client_options("honest")};
  Peer honest_peer;
  std::thread honest;
  std::atomic<bool> stop{false};
  std::atomic<int> honest_errors{0};
  std::atomic<int> honest_fetches{0};
  std::mutex done_mu;
  std::vector<std::chrono::steady_clock::time_point> done_at;  // the honest fetches' completions
  // The honest client's throughput (MB/s) over [from, to).
  double honest_mbps(std::chrono::steady_clock::time_point from,
                     std::chrono::steady_clock::time_point to) {
    std::lock_guard lock(done_mu);
    const auto n =
        std::count_if(done_at.begin(), done_at.end(), [&](auto t) { return t >= from && t < to; });
    return static_cast<double>(n) * static_cast<double>(bytes->size()) / 1e6 /
           std::chrono::duration<double>(to - from).count();
  }
};

TEST_F(BadInput, GarbageBytes) {
  RawClient c(server.port);
  c.send_raw("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // "GET " read as a length: 1.2 GB
  expect_error(c.read(), errc::frame_too_large);
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(BadInput, GarbageAfterHandshake) {
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  c.send_raw(std::string("\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff", 12));
  expect_error(c.read(), errc::protocol_error);
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(BadInput, FourGigabyteFrameLength) {
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  c.send_raw(std::string("\xff\xff\xff\xff", 4));
  expect_error(c.read(), errc::frame_too_large);
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(BadInput, TruncatedFrame) {
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  c.send_raw(std::string("\x00\x00\x01\x00partial", 11));  // says 256 bytes, sends 7
  c.shutdown_send();
  // The server sees the stream end mid-frame and closes this connection.
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(BadInput, TruncatedFirstFrameIsDroppedAfterTheHandshakeTimeout) {
  RawClient c(server.port);
  c.send_raw(std::string("\x00\x00\x01\x00partial", 11));
  EXPECT_TRUE(c.closed_by_server());  // within handshake_timeout (5 s) + margin
}

TEST_F(BadInput, UnknownMessageGetsAnErrorAndTheConnectionLives) {
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  // Envelope{request_id: 5, field 99 (not in this protocol version): varint 1}.
  c.send_raw(std::string("\x00\x00\x00\x05\x08\x05\x98\x06\x01", 9));
  auto reply = c.read();
  expect_error(reply, errc::unknown_message);
  EXPECT_EQ(reply->request_id(), 5u);
  EXPECT_FALSE(reply->error().fatal());
  wire::Envelope ping;
  ping.mutable_ping()->set_nonce(42);
  c.send(ping);
  auto pong = c.read();
  while (pong && pong->has_ping()) pong = c.read();  // the server's own heartbeats
  ASSERT_TRUE(pong && pong->has_pong());
  EXPECT_EQ(pong->pong().nonce(), 42u);
}

TEST_F(BadInput, WrongProtocolVersion) {
  RawClient c(server.port);
  expect_error(c.handshake(999), errc::version_mismatch);
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(BadInput, FetchOfAnObjectThatDoesNotExist) {
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  wire::Envelope env;
  env.set_request_id(17);
  env.mutable_fetch()->set_object_id(123456789);
  env.mutable_fetch()->add_sizes(10);
  c.send(env);
  auto reply = c.read();
  while (reply && reply->has_ping()) reply = c.read();
  expect_error(reply, errc::object_not_found);
  EXPECT_EQ(reply->request_id(), 17u);
  EXPECT_FALSE(reply->error().fatal());
}

// A named fetch's timed_out error repeats its name: with a 1 MiB name it alone takes a control
// queue bounded at 1 MiB past its bound, from inside the loop that sends the errors of the fetches
// whose wait ended. The server ends that connection (it once closed the session from inside that
// loop, freeing the table the loop walked) and serves the next client.
TEST(BadInputQueue, ExpiringParkedFetchesThatOverflowTheControlQueueEndTheConnection) {
  ContextOptions so;
  so.max_queued_control_bytes = 1u << 20;
  Server server(so);
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  const std::string name(1u << 20, 'n');
  // Long enough for the three to be parked before the first expires, on a slow machine too.
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(scaled(500ms));
  for (uint64_t i = 0; i < 3; ++i) {
    wire::Envelope env;
    env.set_request_id(2 * i + 1);
    env.mutable_fetch()->set_name(name + std::to_string(i));
    env.mutable_fetch()->add_sizes(10);
    env.mutable_fetch()->set_wait_ms(static_cast<uint64_t>(wait.count()));
    try {
      c.send(env);
    } catch (const boost::system::system_error& e) {
      // The server ended the connection while the later frames were still being written (the
      // first wait ran out before they were): what is checked below, reached early.
      std::cout << "note: the server closed the connection before fetch " << i
                << " was written: " << e.what() << "\n";
      break;
    }
  }
  EXPECT_TRUE(c.closed_by_server());
  auto bytes = make_pattern(1000, 9);
  auto ref = server.put(bytes);
  Context late(client_options("late"));
  auto peer = connect_or_fail(late, server.address());
  auto req = peer.fetch(ref);
  ASSERT_FALSE(req.wait(scaled(20s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
}

// An AttachChannel for the data channel of session `answer` (a HelloAnswer), attach number
// `seq`, proved with `token`.
wire::Envelope attach_frame(const wire::Envelope& answer, uint64_t seq, const std::string& token,
                            const std::string& transport = "TCP") {
  wire::Envelope env;
  auto* a = env.mutable_attach_channel();
  a->set_session_id(answer.hello_answer().session_id());
  a->set_attach_seq(seq);
  a->set_transport(transport);
  a->set_proof(auth::attach_proof(token, a->session_id(), seq, transport));
  return env;
}

TEST_F(BadInput, ForgedDataChannelAttach) {
  RawClient c(server.port);
  wire::Envelope env;
  env.mutable_attach_channel()->set_session_id(1);
  env.mutable_attach_channel()->set_attach_seq(1);
  env.mutable_attach_channel()->set_proof("guess");
  env.mutable_attach_channel()->set_transport("TCP");
  c.send(env);
  expect_error(c.read(), errc::handshake_failed);
  EXPECT_TRUE(c.closed_by_server());
}

// A data channel attaches with a proof of the session's token, never the token, and each proof
// is good once: a recorded AttachChannel replayed while its session lives is refused, as are a
// proof made with another token and one made for another transport; the next number is
// accepted (Ack; the session keeps the channel it has).
TEST_F(BadInput, AnAttachIsProvedOnceAndCannotBeReplayed) {
  RawClient c(server.port);
  auto answer = c.handshake();
  ASSERT_TRUE(answer && answer->has_hello_answer());
  const std::string token = answer->hello_answer().session_token();
  const auto first = attach_frame(*answer, 1, token);
  std::vector<std::unique_ptr<RawClient>> channels;  // attached ones stay open
  const auto attached = [&](const wire::Envelope& env) {
    auto data = std::make_unique<RawClient>(server.port);
    data->send(env);
    auto reply = data->read();
    if (reply && reply->has_ack()) {
      channels.push_back(std::move(data));
      return true;
    }
    expect_error(reply, errc::handshake_failed);
    EXPECT_TRUE(data->closed_by_server());
    return false;
  };
  EXPECT_TRUE(attached(first));
  EXPECT_FALSE(attached(first)) << "a replayed attach was accepted";
  EXPECT_FALSE(attached(attach_frame(*answer, 2, "not the token")));
  auto other = attach_frame(*answer, 2, token, "CMA");
  other.mutable_attach_channel()->set_transport("TCP");
  EXPECT_FALSE(attached(other)) << "a proof for another transport was accepted";
  EXPECT_TRUE(attached(attach_frame(*answer, 2, token)));
  EXPECT_FALSE(attached(first));
  // The session is still served over its metadata connection.
  wire::Envelope ping;
  ping.mutable_ping()->set_nonce(9);
  c.send(ping);
  bool ponged = false;
  for (auto reply = c.read(); reply && !ponged; reply = c.read()) ponged = reply->has_pong();
  EXPECT_TRUE(ponged);
}

TEST_F(BadInput, LiarsAndFloodersAreRefusedAndBounded) {
  // The honest client's speed alone first, to compare with its speed under attack.
  const auto quiet_from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  const auto quiet_to = std::chrono::steady_clock::now();
  RawClient c(server.port);
  auto answer = c.handshake();
  ASSERT_TRUE(answer && answer->has_hello_answer());
  // A data channel it never reads: whatever the server sends it stays in flight.
  RawClient data(server.port);
  data.send(attach_frame(*answer, 1, answer->hello_answer().session_token()));
  ASSERT_TRUE(data.read()->has_ack());
  // Lies: a range past the end of the object.
  wire::Envelope liar;
  liar.set_request_id(3);
  liar.mutable_fetch()->set_object_id(ref.object_id);
  liar.mutable_fetch()->add_sizes(bytes->size() + 1);
  c.send(liar);
  // A flood: far more fetches of a 3 MiB object than one peer may have in flight.
  const auto limit = server.ctx.options().max_requests_per_peer;
  const size_t flood = limit + 2000;
  std::string frames;
  for (size_t i = 0; i < flood; ++i) {
    wire::Envelope env;
    env.set_request_id(5 + 2 * i);  // the connecting side uses odd ids
    env.mutable_fetch()->set_object_id(ref.object_id);
    env.mutable_fetch()->add_sizes(bytes->size());
    frames += encode_frame(env);
  }
  c.send_raw(frames);
  size_t overloaded = 0;
  bool lie_refused = false;
  for (auto reply = c.read(); reply; reply = c.read()) {
    if (!reply->has_error()) continue;
    if (reply->request_id() == 3) {
      lie_refused = reply->error().code() == static_cast<uint32_t>(errc::size_mismatch);
    } else if (reply->error().code() == static_cast<uint32_t>(errc::overloaded)) {
      ++overloaded;
    }
    if (lie_refused && overloaded >= flood - limit) break;
  }
  EXPECT_TRUE(lie_refused);
  EXPECT_GE(overloaded, flood - limit);
  // What the server holds for this peer is bounded: pins, not copies, at most `limit`.
  auto counts = server.ctx.store().counts(ref.object_id);
  ASSERT_TRUE(counts);
  EXPECT_LE(counts->pins, limit + 1);  // + the honest client's fetch in flight
  std::printf("flood of %zu: %zu refused as overloaded, %u pinned\n", flood, overloaded,
              counts->pins);
  // Under attack: the flood answered, `limit` requests pinned behind a data channel nobody
  // reads. Measured and reported (speed is measured, not asserted: bench/ has the targets);
  // the bound only catches starvation.
  const auto attack_from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  const auto attack_to = std::chrono::steady_clock::now();
  const double quiet = honest_mbps(quiet_from, quiet_to);
  const double attacked = honest_mbps(attack_from, attack_to);
  std::printf(
      "honest client: %.0f MB/s alone, %.0f MB/s with the liar and flooder connected "
      "(%.2f x)\n",
      quiet, attacked, quiet > 0 ? attacked / quiet : 0.0);
  EXPECT_GT(attacked, 0.2 * quiet) << "the honest client is starved under attack";
}

// This process's resident memory, from /proc/self/status (0 when it cannot be read).
size_t rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A plain socket connected to the server, with `bytes` sent on it (blocking; -1 when the connect
// failed).
int raw_connection(uint16_t port, std::string_view bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  if (!bytes.empty() && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string frame_header(uint32_t len) {
  return {static_cast<char>(len >> 24), static_cast<char>(len >> 16), static_cast<char>(len >> 8),
          static_cast<char>(len)};
}

// Connections that have not said who they are cost the server a bounded, small amount of memory
// whatever they announce (ferry/net/core/context_impl.h, Greeting; docs/security.md), and do not
// delay an honest client: with 1,000 of them announcing 4 MiB frames and 1,000 holding half of the
// largest handshake frame, a new client connects and fetches, and the server grows by less than
// the documented bound. (Before, each 4 MiB announcement cost 4 MiB at once: gigabytes.)
TEST_F(BadInput, AThousandUnauthenticatedConnectionsCostLittleAndDelayNoOne) {
  if (test_host() != "127.0.0.1") GTEST_SKIP() << "SKIPPED: loopback only";
  size_t n = 1000;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 2 * n + 512) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 2 * n + 512);
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < 2 * n + 512) {
    n = (lim.rlim_cur - 512) / 2;
    std::printf("only %zu connections of each kind: RLIMIT_NOFILE is %llu\n", n,
                static_cast<unsigned long long>(lim.rlim_cur));
  }
  const size_t rss_before = rss_bytes();
  std::vector<int> fds;
  const std::string big = frame_header(4u << 20);
  const std::string half =
      frame_header(kMaxHandshakeFrameBytes) + std::string(kMaxHandshakeFrameBytes / 2, 'x');
  for (size_t i = 0; i < n; ++i) {
    for (const auto* bytes : {&big, &half}) {
      const int fd = raw_connection(server.port, *bytes);
      ASSERT_GE(fd, 0) << "connection " << fds.size() << ": " << std::strerror(errno);
      fds.push_back(fd);
    }
  }
  // Every one of them accepted and read (the server's io thread is the bottleneck): an honest
  // client's handshake queued behind them completes, and its fetch verifies.
  const auto t0 = std::chrono::steady_clock::now();
  Context late(client_options("late"));
  auto peer = late.connect(server.address());
  ASSERT_TRUE(peer.ok()) << "handshake behind the flood: " << peer.error().message();
  auto req = peer->fetch(ref);
  ASSERT_FALSE(req.wait(scaled(20s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t rss_after = rss_bytes();
  const double grew_mib = (static_cast<double>(rss_after) - static_cast<double>(rss_before)) /
                          static_cast<double>(1u << 20);
  std::printf(
      "%zu unauthenticated connections: the server process grew by %.1f MiB; a new "
      "client connected and fetched in %.3f s\n",
      fds.size(), grew_mib, took);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // AddressSanitizer keeps freed memory in its quarantine and pads every allocation,
  // ThreadSanitizer maps shadow memory for what the process touches: their RSS says little
  // about ferry's bound, which make test checks.
  const double bound_mib = 400.0;
#else
  const double bound_mib = 40.0;
#endif
  EXPECT_LT(grew_mib, bound_mib)
      << "unauthenticated connections cost more than the documented bound";
  for (int fd : fds) ::close(fd);
}

// With a shared secret a connection is not authenticated until its proof, though its Hello has
// made it a session: what it buffers until then is read a little at a time and charged to the
// greetings' budget, so 1,000 such connections holding half of the largest handshake frame after
// their Hello cost the server about what unauthenticated ones cost before it, and delay no one.
TEST(BadInputSecret, AThousandConnectionsThatNeverProveTheSecretCostLittle) {
  if (test_host() != "127.0.0.1") GTEST_SKIP() << "SKIPPED: loopback only";
  size_t n = 1000;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < n + 512) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, n + 512);
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < n + 512) n = lim.rlim_cur - 512;
  ContextOptions so;
  so.secret = "correct horse battery staple";
  Server server(so);
  auto bytes = make_pattern(1u << 20, 5);
  auto ref = server.put(bytes);
  wire::Envelope hello;
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.mutable_hello()->set_name("unproven");
  hello.mutable_hello()->add_transports()->set_name("TCP");
  hello.mutable_hello()->set_auth_nonce(std::string(32, 'n'));
  const std::string then_half = encode_frame(hello) + frame_header(kMaxHandshakeFrameBytes) +
                                std::string(kMaxHandshakeFrameBytes / 2, 'x');
  const size_t rss_before = rss_bytes();
  std::vector<int> fds;
  for (size_t i = 0; i < n; ++i) {
    const int fd = raw_connection(server.port, then_half);
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    fds.push_back(fd);
  }
  ContextOptions co = client_options("late");
  co.secret = so.secret;
  Context late(co);
  auto peer = late.connect(server.address());
  ASSERT_TRUE(peer.ok()) << "handshake behind them: " << peer.error().message();
  auto req = peer->fetch(ref);
  ASSERT_FALSE(req.wait(scaled(20s)));
  EXPECT_TRUE(same_bytes(req.result().tensors[0], *bytes));
  const double grew_mib = (static_cast<double>(rss_bytes()) - static_cast<double>(rss_before)) /
                          static_cast<double>(1u << 20);
  std::printf(
      "%zu connections that sent a Hello and never proved the secret: the server grew by "
      "%.1f MiB\n",
      fds.size(), grew_mib);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const double bound_mib = 400.0;  // the sanitizers' own memory (see above)
#else
  const double bound_mib = 40.0;
#endif
  EXPECT_LT(grew_mib, bound_mib) << "unproven connections cost more than the documented bound";
  for (int fd : fds) ::close(fd);
}

// Out of file descriptors, the listener cannot accept what waits in its queue: it tries again
// every 50 ms and says so once (before, it spun on the queue and wrote the warning thousands of
// times a second, filling the CI log), the honest client carries on, and once descriptors are
// free the waiting connection and new ones are accepted.
TEST_F(BadInput, OutOfDescriptorsTheListenerBacksOffAndAcceptsAgainAfter) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // make test-asan builds with UBSan too: its vptr check opens a pipe, and out of descriptors
  // it reports every first-seen dynamic type as invalid and ends the process.
  GTEST_SKIP() << "SKIPPED: the sanitizers need file descriptors of their own (UBSan's vptr "
                  "check opens a pipe); this test takes them all away. It runs in make test.";
#endif
  // Everything that needs a descriptor or the fixture is done before they run out: while they
  // are out, the sanitizers' own checks can fail (UBSan's vptr check opens a pipe).
  ASSERT_TRUE(eventually([&] { return honest_fetches > 0; }, 30s)) << "the honest client is idle";
  const int waiting = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(waiting, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(server.port);
  ASSERT_EQ(::inet_pton(AF_INET, test_host().c_str(), &to.sin_addr), 1);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  size_t open_now = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++open_now;
  }
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, open_now + 64);
  std::vector<int> fill;
  fill.reserve(128);
  const int honest_before = honest_fetches;
  testing::internal::CaptureStderr();  // opens its file before the descriptors run out
  // Out of descriptors for one second: the waiting connection sits in the listen queue.
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fill.push_back(fd);
  const int fill_errno = errno;
  const int connected = ::connect(waiting, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  const int connect_errno = errno;
  std::this_thread::sleep_for(1s);
  for (int fd : fill) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &old);
  ASSERT_EQ(fill_errno, EMFILE) << std::strerror(fill_errno);
  ASSERT_EQ(connected, 0) << std::strerror(connect_errno);
  // The waiting connection is accepted now: it gets the server's answer to a Hello.
  {
    wire::Envelope env;
    auto* hello = env.mutable_hello();
    hello->set_protocol_version(kProtocolVersion);
    hello->set_name("waited");
    const std::string frame = encode_frame(env);
    ASSERT_EQ(::send(waiting, frame.data(), frame.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(frame.size()));
    pollfd p{waiting, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 10000), 1) << "the waiting connection was not answered in 10 s";
  }
  ::close(waiting);
  RawClient fresh(server.port);
  auto answer = fresh.handshake();
  ASSERT_TRUE(answer.has_value());
  EXPECT_TRUE(answer->has_hello_answer());
  const std::string log = testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = 0; (at = log.find("accept failed", at)) != std::string::npos; ++at) ++warnings;
  EXPECT_EQ(warnings, 1u) << log.substr(0, 2000);
  EXPECT_NE(log.find("accepting again after"), std::string::npos) << log.substr(0, 2000);
  EXPECT_TRUE(eventually([&] { return honest_fetches > honest_before; }, 30s))
      << "the honest client stopped";
}

TEST_F(BadInput, HelloTwiceIsAProtocolError) {
  RawClient c(server.port);
  ASSERT_TRUE(c.handshake()->has_hello_answer());
  auto again = c.handshake();
  while (again && again->has_ping()) again = c.read();
  expect_error(again, errc::protocol_error);
  EXPECT_TRUE(c.closed_by_server());
}

}  // namespace
}  // namespace ferry::test
