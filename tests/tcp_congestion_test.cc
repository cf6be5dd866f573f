// tcp::TcpOptions::congestion on real loopback sockets (ferry/tcp/congestion.h): what the
// automatic choice does on one host, "system", a named algorithm, and one the kernel refuses.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ferry/tcp/congestion.h"
#include "tests/test_util.h"

namespace ferry::tcp {
namespace {

namespace asio = boost::asio;
using asio::ip::make_address;
using Socket = asio::ip::tcp::socket;

// A connected pair of sockets on 127.0.0.1.
struct LoopbackPair {
  LoopbackPair() {
    asio::ip::tcp::acceptor acceptor(io, {make_address("127.0.0.1"), 0});
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
  }
  asio::io_context io;
  Socket client{io};
  Socket server{io};
};

std::string algorithm_of(Socket& s) {
  char name[32] = {};
  socklen_t len = sizeof(name) - 1;
  if (::getsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "?";
  return std::string(name, ::strnlen(name, len));
}

// Sets `algorithm` directly (as a system default would); "" on success, else why not.
std::string set_directly(Socket& s, const std::string& algorithm) {
  if (::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, algorithm.data(),
                   static_cast<socklen_t>(algorithm.size())) == 0) {
    return "";
  }
  return std::strerror(errno);
}

#define REQUIRE_ALGORITHM(socket, name)                                                     \
  if (auto why = set_directly(socket, name); !why.empty()) {                                \
    GTEST_SKIP() << "SKIPPED: this kernel does not give a socket '" << name << "' (" << why \
                 << "), which the test starts from";                                        \
  }

TEST(TcpCongestion, SameHostMeansALoopbackPeerOrTheSameAddressAtBothEnds) {
  EXPECT_TRUE(same_host(make_address("127.0.0.1"), make_address("127.0.0.1")));
  EXPECT_TRUE(same_host(make_address("10.1.2.3"), make_address("127.0.0.1")));
  EXPECT_TRUE(same_host(make_address("10.1.2.3"), make_address("10.1.2.3")));
  EXPECT_TRUE(same_host(make_address("::1"), make_address("::1")));
  EXPECT_FALSE(same_host(make_address("10.1.2.3"), make_address("10.1.2.4")));
  EXPECT_FALSE(same_host(make_address("fd00::1"), make_address("fd00::2")));
}

TEST(TcpCongestion, AutomaticPutsAPacingChannelOnOneHostOnReno) {
  LoopbackPair p;
  REQUIRE_ALGORITHM(p.server, "bbr");
  EXPECT_EQ(tune_congestion(p.server.native_handle(), ""), kOneHostCongestion);
  EXPECT_EQ(algorithm_of(p.server), kOneHostCongestion);
}

TEST(TcpCongestion, AutomaticPutsACubicChannelOnOneHostOnReno) {
  LoopbackPair p;
  REQUIRE_ALGORITHM(p.client, "cubic");
  EXPECT_EQ(tune_congestion(p.client.native_handle(), ""), kOneHostCongestion);
  EXPECT_EQ(algorithm_of(p.client), kOneHostCongestion);
}

TEST(TcpCongestion, SystemKeepsEvenAPacingAlgorithm) {
  LoopbackPair p;
  REQUIRE_ALGORITHM(p.server, "bbr");
  EXPECT_EQ(tune_congestion(p.server.native_handle(), "system"), "bbr");
  EXPECT_EQ(algorithm_of(p.server), "bbr");
}

TEST(TcpCongestion, ANamedAlgorithmIsSetWhateverTheSocketHad) {
  LoopbackPair p;
  REQUIRE_ALGORITHM(p.client, "cubic");
  EXPECT_EQ(tune_congestion(p.client.native_handle(), "reno"), "reno");
  EXPECT_EQ(algorithm_of(p.client), "reno");
}

TEST(TcpCongestion, AnAlgorithmTheKernelRefusesLeavesTheSocketAsItWas) {
  LoopbackPair p;
  const std::string before = algorithm_of(p.server);
  ASSERT_NE(before, "?");
  EXPECT_EQ(tune_congestion(p.server.native_handle(), "no-such-algorithm"), before);
  EXPECT_EQ(algorithm_of(p.server), before);
  // The connection still carries bytes.
  const char out[] = "still connected";
  asio::write(p.server, asio::buffer(out));
  char in[sizeof(out)] = {};
  asio::read(p.client, asio::buffer(in));
  EXPECT_STREQ(in, out);
}

// This process's connected TCP sockets whose local or peer port is `port`, with their algorithm.
std::vector<std::string> algorithms_of_connections_on(uint16_t port, bool local) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage mine{}, theirs{};
    socklen_t a = sizeof(mine), b = sizeof(theirs);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) != 0 ||
        mine.ss_family != AF_INET) {
      continue;
    }
    const auto& at = reinterpret_cast<const sockaddr_in&>(local ? mine : theirs);
    if (ntohs(at.sin_port) != port) continue;
    char name[32] = {};
    socklen_t len = sizeof(name) - 1;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) continue;
    out.emplace_back(name, ::strnlen(name, len));
  }
  return out;
}

// End to end: a Context's TCP data channel takes the option at both ends, named or automatic
// (reno on one host); its metadata channel keeps the system's default.
class TcpCongestionOption : public ::testing::TestWithParam<std::string> {};

TEST_P(TcpCongestionOption, AContextAppliesItToItsDataChannelAtBothEndsOnly) {
  LoopbackPair probe;
  const std::string system_default = algorithm_of(probe.client);
  if (system_default == "reno") {
    GTEST_SKIP() << "SKIPPED: the system's default is already reno: the data channel could not "
                    "be told apart";
  }
  ContextOptions o;
  o.transport = "TCP";
  o.transport_options_for<tcp::TcpOptions>(tcp::kTransportName).congestion = GetParam();
  Context server(o), client(o);
  auto port = server.listen("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  auto peer = test::connect_or_fail(client, server.address());
  ASSERT_TRUE(peer.valid());
  auto bytes = test::make_pattern(1 << 20, 7);
  auto ref = server.put({Tensor::bytes(*bytes)}, bytes);
  ASSERT_TRUE(ref.ok());
  auto req = peer.fetch(*ref);
  ASSERT_FALSE(req.wait(std::chrono::seconds(30)));
  ASSERT_TRUE(test::same_bytes(req.result().tensors.at(0), *bytes));
  for (bool server_side : {true, false}) {
    SCOPED_TRACE(server_side ? "server side" : "client side");
    auto algorithms = algorithms_of_connections_on(*port, server_side);
    std::sort(algorithms.begin(), algorithms.end());
    // The metadata connection and the data channel.
    ASSERT_EQ(algorithms.size(), 2u);
    EXPECT_EQ(std::count(algorithms.begin(), algorithms.end(), "reno"), 1);
    EXPECT_EQ(std::count(algorithms.begin(), algorithms.end(), system_default), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(NamedOrAutomatic, TcpCongestionOption, ::testing::Values("reno", ""),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("Automatic") : info.param;
                         });

}  // namespace
}  // namespace ferry::tcp
