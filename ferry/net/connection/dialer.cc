#include "ferry/net/connection/dialer.h"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <memory>
#include <optional>
#include <vector>

#include "ferry/net/errors.h"
#include "ferry/net/frame.h"
#include "ferry/net/log.h"
#include "ferry/net/proto/wire_convert.h"
#include "ferry/net/system/socket_util.h"

namespace ferry {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);

// One dial: its steps run as a coroutine on strand_, and its deadline on the same strand closes
// whatever the steps are waiting on, so that the step ends with an error that reads as
// errc::timed_out.
class Dial : public std::enable_shared_from_this<Dial> {
 public:
  Dial(asio::io_context& io, asio::any_io_executor caller, HostPort target, DialOptions options,
       DialHandler done)
      : caller_(std::move(caller)),
        strand_(asio::make_strand(io)),
        target_(std::move(target)),
        options_(std::move(options)),
        done_(std::move(done)),
        resolver_(io),
        socket_(io),
        timer_(io) {}

  void start() {
    timer_.expires_after(options_.deadline);
    timer_.async_wait(
        asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
          if (!ec && !self->finished_) self->expire();
        }));
    asio::co_spawn(strand_, run(), [self = shared_from_this()](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::bad_alloc&) {
        self->finish(errc::resource_exhausted);
      } catch (...) {
        self->finish(errc::connection_failed);
      }
    });
  }

 private:
  asio::awaitable<void> run() {
    if (auto ec = co_await steps()) {
      finish(ec);
    } else {
      finish(Dialed{std::move(*stream_), std::move(answer_)});
    }
  }

  asio::awaitable<std::error_code> steps() {
    const unsigned port = port_number();
    const std::string where = format_host_port(target_.host, port);
    boost::system::error_code not_ip;
    const auto ip = asio::ip::make_address(target_.host, not_ip);
    std::vector<tcp::endpoint> endpoints;
    if (!not_ip) {
      endpoints.emplace_back(ip, port);
    } else {
      auto [ec, results] = co_await resolver_.async_resolve(target_.host, target_.port, kAwait);
      if (ec) {
        FERRY_LOG_INFO("resolve {} failed: {}", target_.host, ec.message());
        co_return or_timed_out(errc::host_unresolved);
      }
      for (const auto& r : results) endpoints.push_back(r.endpoint());
    }
    auto [ec, endpoint] = co_await asio::async_connect(socket_, endpoints, kAwait);
    if (ec) {
      FERRY_LOG_INFO("connect to {} failed: {}", where, ec.message());
      co_return or_timed_out(ec == asio::error::connection_refused ? errc::connection_refused
                                                                   : errc::connection_failed);
    }
    close_on_exec(socket_.native_handle());
    boost::system::error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    stream_.emplace(std::move(socket_));

    if (options_.tls) {
      stream_->start_tls(*options_.tls);
      auto& tls = stream_->tls();
      tls.set_verify_callback(asio::ssl::host_name_verification(target_.host));
      if (not_ip) SSL_set_tlsext_host_name(tls.native_handle(), target_.host.c_str());
      auto [tec] = co_await tls.async_handshake(asio::ssl::stream_base::client, kAwait);
      if (tec) {
        FERRY_LOG_WARN("TLS handshake with {} failed: {}", where, tec.message());
        co_return or_timed_out(errc::tls_failed);
      }
    }
    if (options_.first_frame.empty()) co_return std::error_code{};

    auto [wec, written] = co_await stream_->async_write(asio::buffer(options_.first_frame), kAwait);
    if (wec) co_return or_timed_out(errc::connection_failed);
    std::array<unsigned char, kFrameHeaderBytes> header{};
    auto [hec, got] = co_await stream_->async_read(asio::buffer(header), kAwait);
    if (hec) co_return or_timed_out(errc::handshake_failed);
    const uint32_t length = decode_frame_length(header.data());
    if (length > options_.max_answer_bytes) co_return errc::protocol_error;
    std::string body(length, '\0');
    auto [bec, read] = co_await stream_->async_read(asio::buffer(body), kAwait);
    if (bec) co_return or_timed_out(errc::handshake_failed);
    if (parse_envelope(body, answer_)) co_return errc::protocol_error;
    if (answer_.has_error()) co_return error_from_wire(answer_.error().code());
    co_return std::error_code{};
  }

  // HostPort's port is decimal digits in 0-65535 (parse_host_port).
  unsigned port_number() const {
    unsigned port = 0;
    std::from_chars(target_.port.data(), target_.port.data() + target_.port.size(), port);
    return port;
  }

  std::error_code or_timed_out(std::error_code ec) const {
    if (cancelled_) return errc::aborted;
    return timed_out_ ? std::error_code(errc::timed_out) : ec;
  }

 public:
  // Ends the dial with errc::aborted unless it has ended. Any thread.
  void cancel() {
    asio::post(strand_, [self = shared_from_this()] {
      if (self->finished_) return;
      self->cancelled_ = true;
      self->expire();
    });
  }

 private:
  // The deadline (or cancel()): ends the step in progress (strand).
  void expire() {
    if (!cancelled_) timed_out_ = true;
    resolver_.cancel();
    if (stream_) {
      stream_->close();
    } else {
      boost::system::error_code ignored;
      socket_.close(ignored);
    }
  }

  // Hands the outcome to the caller's executor, once (strand).
  void finish(Result<Dialed> result) {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    asio::post(caller_, [done = std::move(done_), result = std::move(result)]() mutable {
      done(std::move(result));
    });
  }

  asio::any_io_executor caller_;
  asio::strand<asio::io_context::executor_type> strand_;
  HostPort target_;
  DialOptions options_;
  DialHandler done_;
  tcp::resolver resolver_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::optional<MetaStream> stream_;  // once connected
  wire::Envelope answer_;
  bool timed_out_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace

std::function<void()> async_dial(asio::io_context& io, asio::any_io_executor executor,
                                 HostPort target, DialOptions options, DialHandler done) {
  std::shared_ptr<Dial> dial;
  try {
    dial = std::make_shared<Dial>(io, executor, std::move(target), std::move(options), done);
  } catch (const std::bad_alloc&) {
    asio::post(executor, [done = std::move(done)] { done(errc::resource_exhausted); });
    return [] {};
  }
  dial->start();
  return [weak = std::weak_ptr<Dial>(dial)] {
    if (auto d = weak.lock()) d->cancel();
  };
}

}  // namespace ferry
