// Fuzz target: control-message handling on a live server. One server Context lives for the whole
// run; each input but its first byte is sent on a fresh connection (after a valid Hello when
// that first byte is odd), the server's answers are drained until it closes the connection or goes
// quiet, and the server must then still answer an honest request. Crashes, sanitizer reports and a
// server that stops serving are failures.
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "ferry/net/frame.h"
#include "ferry/net/proto/ferry.pb.h"

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct Fixture {
  Fixture() {
    ferry::ContextOptions o;
    o.name = "fuzz-server";
    o.handshake_timeout = std::chrono::milliseconds(200);
    server = std::make_unique<ferry::Context>(o);
    port = *server->listen("127.0.0.1:0");
    bytes = std::make_shared<std::vector<std::byte>>(4096, std::byte{7});
    ref = *server->put({ferry::Tensor::bytes(*bytes)}, bytes);
  }
  std::unique_ptr<ferry::Context> server;
  uint16_t port = 0;
  std::shared_ptr<std::vector<std::byte>> bytes;
  ferry::ObjectRef ref;
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

std::string hello_frame() {
  ferry::wire::Envelope env;
  auto* h = env.mutable_hello();
  h->set_protocol_version(ferry::kProtocolVersion);
  h->set_name("fuzz");
  h->add_transports()->set_name("TCP");
  return ferry::encode_frame(env);
}

// Reads what the server says until it closes, stays quiet for 20 ms, or 500 ms have passed.
void drain(tcp::socket& s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{s.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) return;
    if (::recv(s.native_handle(), buf, sizeof(buf), MSG_DONTWAIT) <= 0) return;
  }
}

// Ends the run, saying why on a line `make fuzz` shows (it keeps lines with "ERROR").
[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "ERROR: fuzz_control: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& f = fixture();
  asio::io_context io;
  {
    tcp::socket s(io);
    boost::system::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), f.port}, ec);
    if (ec) fail("connect for the input: " + ec.message());
    if (size == 0) return 0;
    // First byte: send a valid Hello first (odd) or not; the rest goes on the wire as is.
    std::string out = (data[0] & 1) ? hello_frame() : std::string();
    out.append(reinterpret_cast<const char*>(data) + 1, size - 1);
    asio::write(s, asio::buffer(out), ec);
    drain(s);
  }
  // The server still serves an honest peer.
  static std::unique_ptr<ferry::Context> client = [] {
    ferry::ContextOptions o;
    o.name = "fuzz-client";
    return std::make_unique<ferry::Context>(o);
  }();
  static ferry::Peer peer;
  if (!peer.is_open()) {
    auto p = client->connect("127.0.0.1:" + std::to_string(f.port));
    if (!p) fail("the honest client's connect: " + p.error().message());
    peer = *p;
  }
  auto req = peer.fetch(f.ref);
  if (auto ec = req.wait(std::chrono::seconds(10))) fail("the honest fetch: " + ec.message());
  return 0;
}
