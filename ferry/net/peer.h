/// @file
/// Peer: a connected peer, as the application sees it. Cheap to copy (a shared handle: copies
/// talk over the same connection). Every call but close() is const; any thread may call them,
/// the blocking ones (hold, release, list) not an io_context thread.
#pragma once

#include <boost/asio/async_result.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "ferry/net/fetch.h"
#include "ferry/net/object_ref.h"
#include "ferry/net/result.h"
#include "ferry/net/transport.h"

namespace ferry {

class Session;

/// A connection to another Context, as the application sees it (see this file's comment):
/// Context::connect() and async_connect() make one. Copies share the connection; it stays up until
/// either side closes it, it breaks, or its Context closes, whatever the handles do.
class Peer {
 public:
  Peer() = default;
  /// A handle on `session`: how the Context makes one (applications get Peers from
  /// Context::connect).
  explicit Peer(std::shared_ptr<Session> session);

  /// Whether it refers to a connection (false for a default-constructed Peer). Any thread.
  bool valid() const { return session_ != nullptr; }
  /// Whether the connection is up: false once either side closed it or it broke, and for an invalid
  /// handle. Any thread.
  bool is_open() const;
  /// A copy of what we know of the peer (its transports can change: see announce in docs).
  PeerInfo info() const;
  /// The transport negotiated at Hello (used when a fetch names none).
  std::string transport() const;
  /// Whether transport() combines as the bytes arrive: it streams FetchOptions::combine through
  /// them piece by piece (TransportManager::combines(), TCP), so a combining fetch never lands
  /// whole; otherwise ferry lands the bytes in a buffer of its own and combines them on success.
  /// False for an invalid handle. Any thread.
  bool combines_as_it_arrives() const;

  /// Fetches `ref` from this peer. `targets` are where the tensors land (one buffer per tensor,
  /// each exactly the tensor's size); empty = ferry allocates, from the context's receive pool.
  /// While other fetches of the context are in flight it does so on the calling thread, before
  /// this returns: a fetch that needs a new pool region faults it in there (the kernel zeroes its
  /// pages, several threads at once for a large one) while the io threads go on moving the other
  /// fetches' bytes. Completion:
  /// void(boost::system::error_code, FetchResult), delivered through the token's executor, never
  /// inline. Works with callbacks, use_future and use_awaitable. A fetch whose data channel breaks
  /// under it while the peer lives (a one-sided transport's queue pair flushed, stalled or reset;
  /// the READs are harmless to repeat) is started again over a new channel, within its deadline,
  /// at most kMaxFetchRestarts times (FetchResult::restarts); it fails only after that.
  template <typename Token>
  auto async_fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                   Token&& token) const {
    return boost::asio::async_initiate<Token, FetchSignature>(
        [self = *this](auto handler, ObjectRef ref, std::vector<MutableBuffer> targets,
                       FetchOptions options) {
          self.start_fetch(std::move(ref), std::move(targets), std::move(options),
                           FetchHandler(std::move(handler)));
        },
        token, std::move(ref), std::move(targets), std::move(options));
  }
  /// async_fetch() with default FetchOptions.
  template <typename Token>
  auto async_fetch(ObjectRef ref, std::vector<MutableBuffer> targets, Token&& token) const {
    return async_fetch(std::move(ref), std::move(targets), FetchOptions{},
                       std::forward<Token>(token));
  }
  /// async_fetch() into memory ferry allocates (FetchResult::storage), with default FetchOptions.
  template <typename Token>
  auto async_fetch(ObjectRef ref, Token&& token) const {
    return async_fetch(std::move(ref), {}, FetchOptions{}, std::forward<Token>(token));
  }

  /// The TransportManager-style form: returns a handle to wait on or abort.
  FetchRequest fetch(ObjectRef ref, std::vector<MutableBuffer> targets = {},
                     FetchOptions options = {}) const;
  /// Both at once: a handle to wait on or abort, and `handler`, which runs once when the fetch
  /// completes (on the context's executor, never inline; an invalid Peer completes it with
  /// peer_closed, one whose Context has closed with context_closed, through the system
  /// executor). For bindings that resolve their own futures from
  /// the completion and still need abort().
  FetchRequest fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                     FetchHandler handler) const;

  /// Remote references: hold() keeps the object alive on its owner until release() (or until
  /// this connection ends). Blocking with `timeout`; not from an io_context thread.
  std::error_code hold(const ObjectRef& ref, std::chrono::milliseconds timeout) const;
  /// Drops one hold() of `ref`; the owner collects the object once nothing else holds it.
  /// errc::object_not_found when this connection holds no reference to it, errc::timed_out without
  /// an answer within `timeout`, errc::peer_closed on a closed (or invalid) Peer,
  /// errc::context_closed once its Context has closed. Blocking; not
  /// from an io_context thread.
  std::error_code release(const ObjectRef& ref, std::chrono::milliseconds timeout) const;
  /// The refs the peer's store holds. Blocking with `timeout`; not from an io_context thread.
  Result<std::vector<ObjectRef>> list(std::chrono::milliseconds timeout) const;

  /// Closes the connection; pending fetches fail with peer_closed. Idempotent, any thread.
  void close();

 private:
  void start_fetch(ObjectRef ref, std::vector<MutableBuffer> targets, FetchOptions options,
                   FetchHandler handler) const;
  std::shared_ptr<Session> session_;
};

}  // namespace ferry
