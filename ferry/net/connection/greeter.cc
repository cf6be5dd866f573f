#include "ferry/net/connection/greeter.h"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "ferry/net/address.h"
#include "ferry/net/errors.h"
#include "ferry/net/frame.h"
#include "ferry/net/log.h"
#include "ferry/net/proto/wire_convert.h"
#include "ferry/net/security/tls.h"
#include "ferry/net/system/socket_util.h"

namespace ferry {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);
}  // namespace

Greeting::Greeting(tcp::socket socket, GreetOptions options, std::string peer)
    : strand_(asio::make_strand(socket.get_executor())),
      stream_(std::move(socket)),
      options_(std::move(options)),
      peer_(std::move(peer)),
      timer_(strand_) {}

Greeting::~Greeting() {
  if (charged_) options_.budget->give_back(charged_);
}

void async_greet(tcp::socket socket, GreetOptions options,
                 std::function<void(std::shared_ptr<Greeting>)> on_frame) {
  close_on_exec(socket.native_handle());
  boost::system::error_code ignored;
  const auto remote = socket.remote_endpoint(ignored);
  auto g =
      std::make_shared<Greeting>(std::move(socket), std::move(options),
                                 format_host_port(remote.address().to_string(), remote.port()));
  g->start(std::move(on_frame));
}

void Greeting::start(OnFrame on_frame) {
  timer_.expires_after(options_.deadline);
  // Silent or too slow: not a peer. Held by the strand's queue only: a greeting nobody holds
  // any more is closed already.
  timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
    if (auto self = weak.lock(); self && !ec) self->stream_.close();
  });
  asio::co_spawn(
      strand_,
      [self = shared_from_this(), on_frame = std::move(on_frame)]() -> asio::awaitable<void> {
        if (co_await self->read_first_frame()) on_frame(self);
      },
      [self = shared_from_this()](std::exception_ptr e) {
        if (e) self->finish();  // out of memory for a greeting: not served
      });
}

asio::awaitable<bool> Greeting::read_first_frame() {
  // The first byte tells a TLS ClientHello from a plain frame (kTlsHandshakeByte).
  auto [wec] = co_await stream_.socket().async_wait(tcp::socket::wait_read, kAwait);
  if (wec) co_return false;
  unsigned char first = 0;
  boost::system::error_code rec;
  const size_t peeked =
      stream_.socket().receive(asio::buffer(&first, 1), tcp::socket::message_peek, rec);
  if (rec || peeked != 1) co_return false;
  if (first == kTlsHandshakeByte) {
    if (!options_.tls) {
      FERRY_LOG_WARN(
          "connection from {} rejected: it speaks TLS, and this context has no TLS "
          "certificate (ContextOptions::tls)",
          peer_);
      co_return false;
    }
    stream_.start_tls(*options_.tls);
    auto [tec] = co_await stream_.tls().async_handshake(asio::ssl::stream_base::server, kAwait);
    if (tec) {
      FERRY_LOG_WARN("TLS handshake with {} failed: {}", peer_, tec.message());
      co_return false;
    }
  }

  auto [hec, header_bytes] = co_await stream_.async_read(asio::buffer(header_), kAwait);
  if (hec) co_return false;
  expected_ = decode_frame_length(header_.data());
  if (expected_ > options_.max_frame_bytes) {
    reject(errc::frame_too_large, "first frame of " + std::to_string(expected_) +
                                      " bytes exceeds the handshake maximum of " +
                                      std::to_string(options_.max_frame_bytes));
    co_return false;
  }
  while (got_ < expected_) {
    // What has come so far, twice over, at most what is still missing: a peer that announces a
    // frame and sends nothing holds kFirstRead bytes.
    const size_t step =
        std::min<size_t>(expected_ - got_, std::max(got_, GreetingBudget::kFirstRead));
    if (!reserve(got_ + step)) {
      FERRY_LOG_WARN(
          "connection from {} closed: connections that have not finished their handshake hold "
          "{} bytes already",
          peer_, GreetingBudget::kBytes);
      co_return false;
    }
    auto [bec, n] =
        co_await stream_.async_read_some(asio::buffer(body_.data() + got_, step), kAwait);
    if (bec) co_return false;
    got_ += n;
  }
  if (parse_envelope(std::string_view(body_).substr(0, got_), frame_)) {
    reject(errc::protocol_error, "malformed frame");
    co_return false;
  }
  co_return true;
}

bool Greeting::reserve(size_t bytes) {
  if (bytes <= body_.size()) return true;
  // The first kFirstRead bytes are free: a real Hello fits in them, so a flood that holds the
  // budget cannot keep an honest peer from saying who it is.
  const uint64_t charge =
      bytes > GreetingBudget::kFirstRead ? bytes - GreetingBudget::kFirstRead : 0;
  if (charge > charged_) {
    if (!options_.budget->take(charge - charged_)) return false;
    charged_ = charge;
  }
  body_.resize(bytes);
  return true;
}

MetaStream Greeting::take() {
  timer_.cancel();
  return std::move(stream_);
}

void Greeting::reject(std::error_code ec, const std::string& why) {
  FERRY_LOG_WARN("connection from {} rejected: {}", peer_, why);
  auto frame = std::make_shared<std::string>(encode_frame(error_envelope(0, ec, why, true)));
  stream_.async_write(
      asio::buffer(*frame),
      asio::bind_executor(strand_, [self = shared_from_this(), frame](boost::system::error_code,
                                                                      size_t) { self->finish(); }));
}

void Greeting::finish() {
  stream_.close();
  timer_.cancel();
}

}  // namespace ferry
