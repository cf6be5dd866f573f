#include "ferry/net/peer.h"

#include <future>

#include "ferry/net/completion.h"
#include "ferry/net/errors.h"
#include "ferry/net/proto/ferry.pb.h"
#include "ferry/net/proto/wire_convert.h"
#include "ferry/net/session/session.h"

namespace ferry {
namespace {

// Runs a control request and waits for its answer; the request carries its own timeout.
std::pair<std::error_code, wire::Envelope> call(Session& session, wire::Envelope request,
                                                std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<std::pair<std::error_code, wire::Envelope>>>();
  auto future = promise->get_future();
  session.rpc(std::move(request), timeout,
              [promise](std::error_code ec, const wire::Envelope& reply) {
                promise->set_value({ec, reply});
              });
  // The rpc's own timer fires at `timeout`; the margin only guards against a stopped loop.
  if (future.wait_for(timeout + std::chrono::seconds(2)) != std::future_status::ready) {
    return {make_error_code(errc::timed_out), {}};
  }
  return future.get();
}

// Why `session` can take no request: peer_closed without one, context_closed once its
// context's close() has begun (its loop may have stopped: a request posted to it would never
// run, nor complete); none otherwise.
std::error_code unusable(const std::shared_ptr<Session>& session) {
  if (!session) return errc::peer_closed;
  if (session->context_closed()) return errc::context_closed;
  return {};
}

}  // namespace

Peer::Peer(std::shared_ptr<Session> session) : session_(std::move(session)) {}

bool Peer::is_open() const { return session_ && session_->is_open(); }

PeerInfo Peer::info() const { return session_ ? session_->info_snapshot() : PeerInfo{}; }

std::string Peer::transport() const { return session_ ? session_->chosen_transport() : ""; }

bool Peer::combines_as_it_arrives() const { return session_ && session_->chosen_combines(); }

void Peer::start_fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                       FetchHandler handler) const {
  if (auto ec = unusable(session_)) {
    // No loop to run it: complete through the system executor (never inline).
    detail::post_completion(boost::asio::system_executor(), std::move(handler),
                            boost::system::error_code(ec), FetchResult{});
    return;
  }
  session_->fetch(std::move(ref), std::move(targets), std::move(options), std::move(handler));
}

FetchRequest Peer::fetch(ObjectRef ref, std::vector<MutableBuffer> targets,
                         FetchOptions options) const {
  if (auto ec = unusable(session_)) {
    auto state = std::make_shared<detail::FetchState>(0, boost::asio::system_executor());
    state->complete(ec);
    return FetchRequest(state);
  }
  return session_->fetch(std::move(ref), std::move(targets), std::move(options), {});
}

FetchRequest Peer::fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                         FetchHandler handler) const {
  if (auto ec = unusable(session_)) {
    auto state = std::make_shared<detail::FetchState>(0, boost::asio::system_executor());
    state->set_handler(std::move(handler));
    state->complete(ec);
    return FetchRequest(state);
  }
  return session_->fetch(std::move(ref), std::move(targets), std::move(options),
                         std::move(handler));
}

std::error_code Peer::hold(const ObjectRef& ref, std::chrono::milliseconds timeout) const {
  if (auto ec = unusable(session_)) return ec;
  wire::Envelope env;
  env.mutable_add_ref()->set_object_id(ref.object_id);
  return call(*session_, std::move(env), timeout).first;
}

std::error_code Peer::release(const ObjectRef& ref, std::chrono::milliseconds timeout) const {
  if (auto ec = unusable(session_)) return ec;
  wire::Envelope env;
  env.mutable_release_ref()->set_object_id(ref.object_id);
  return call(*session_, std::move(env), timeout).first;
}

Result<std::vector<ObjectRef>> Peer::list(std::chrono::milliseconds timeout) const {
  if (auto ec = unusable(session_)) return ec;
  wire::Envelope env;
  env.mutable_list_objects();
  auto [ec, reply] = call(*session_, std::move(env), timeout);
  if (ec) return ec;
  if (!reply.has_object_list()) return errc::protocol_error;
  std::vector<ObjectRef> out;
  for (const auto& w : reply.object_list().refs()) {
    ObjectRef ref;
    if (!from_wire(w, ref)) return errc::protocol_error;
    out.push_back(std::move(ref));
  }
  return out;
}

void Peer::close() {
  if (session_) session_->close(errc::peer_closed);
}

}  // namespace ferry
