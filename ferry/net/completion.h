/// @file
/// Delivering completions: never inline, always through the handler's associated executor.
#pragma once

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <tuple>
#include <utility>

namespace ferry::detail {

// Queues `handler(args...)` on `io_ex`; from there it is dispatched to the handler's own
// executor (a strand, a coroutine's executor, ...). The caller's stack never runs it.
template <typename Executor, typename Handler, typename... Args>
void post_completion(const Executor& io_ex, Handler handler, Args... args) {
  boost::asio::post(io_ex, [io_ex, handler = std::move(handler),
                            args = std::make_tuple(std::move(args)...)]() mutable {
    auto ex = boost::asio::get_associated_executor(handler, io_ex);
    boost::asio::dispatch(ex, [handler = std::move(handler), args = std::move(args)]() mutable {
      std::apply(handler, std::move(args));
    });
  });
}

}  // namespace ferry::detail
