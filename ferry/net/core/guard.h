// The callback guard (internal): the one wrapper for the completion handlers of an object that
// lives on a strand and can close (a session, its control stream, a transport's channel).
#pragma once

#include <boost/asio/bind_executor.hpp>
#include <boost/system/error_code.hpp>
#include <concepts>
#include <memory>
#include <new>
#include <utility>

namespace ferry {

// What guarded() needs from the object: the strand it lives on, a reference that keeps it alive,
// whether it has closed (read on the strand), and what it does when a handler of it ran out of
// memory (out_of_memory(): it ends, failing what it had in flight with errc::resource_exhausted,
// since a handler stopped halfway may have left work that nothing will finish; on the strand).
template <typename Owner>
concept Guardable = requires(Owner& owner) {
  owner.strand();
  owner.keep_alive();
  { owner.closed() } -> std::convertible_to<bool>;
  owner.out_of_memory();
};

// What Guardable asks, for a class held by shared_ptr that lives on a strand of type `Strand`:
// derive from it, construct it with the strand, set closed_ once it has closed (and give it
// out_of_memory()).
template <typename Derived, typename Strand>
class StrandGuarded : public std::enable_shared_from_this<Derived> {
 public:
  Strand& strand() { return strand_; }
  std::shared_ptr<void> keep_alive() { return this->shared_from_this(); }
  bool closed() const { return closed_; }

 protected:
  explicit StrandGuarded(Strand strand) : strand_(std::move(strand)) {}
  Strand strand_;
  bool closed_ = false;
};

// A completion handler that runs `fn` on `owner`'s strand, keeps `owner` alive until it has run,
// and drops the call when `owner` has closed by then: a closed object handles nothing more, and
// `fn` may use the object freely (capture `this`). The handler passes whatever the operation
// completes with on to `fn`. When `fn` throws std::bad_alloc the owner's out_of_memory() runs
// instead of the exception leaving the io loop (where the work `fn` left would wait for good).
template <Guardable Owner, typename Fn>
auto guarded(Owner& owner, Fn fn) {
  return boost::asio::bind_executor(owner.strand(), [&owner, keep = owner.keep_alive(),
                                                     fn = std::move(fn)](auto&&... args) mutable {
    if (owner.closed()) return;
    try {
      fn(std::forward<decltype(args)>(args)...);
    } catch (const std::bad_alloc&) {
      if (!owner.closed()) owner.out_of_memory();  // unless `fn` had closed it already
    }
  });
}

// guarded() for a timer's wait: `fn()` runs only when the timer expired (not when it was
// cancelled or re-armed) and `owner` is still open.
template <Guardable Owner, typename Fn>
auto on_expiry(Owner& owner, Fn fn) {
  return guarded(owner, [fn = std::move(fn)](boost::system::error_code ec) mutable {
    if (!ec) fn();
  });
}

}  // namespace ferry
