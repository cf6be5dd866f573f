/// @file
/// Delivering completions: never inline, always through the handler's associated executor.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <memory>
#include <new>
#include <tuple>
#include <utility>

#include "ferry/net/loop_gate.h"

namespace ferry::detail {

// `handler(args...)`, dispatched to the handler's own executor (a strand, a coroutine's
// executor, ...), or to `fallback` when it has none, from the thread that runs this call.
template <typename Handler, typename... Args>
struct CompletionCall {
  boost::asio::any_io_executor fallback;
  Handler handler;
  std::tuple<Args...> args;

  void operator()() {
    auto ex = boost::asio::get_associated_executor(handler, fallback);
    boost::asio::dispatch(ex, [handler = std::move(handler), args = std::move(args)]() mutable {
      std::apply(handler, std::move(args));
    });
  }
};

// Queues `call` with `post(call)`. Out of memory to queue it (Asio allocates each posted
// operation before it takes the function, so `call` still holds the handler then), the handler
// runs here, on this thread: the one case where a completion runs inline, since a completion is
// never lost.
template <typename Handler, typename... Args, typename Post>
void post_or_run(CompletionCall<Handler, Args...>& call, Post&& post) {
  try {
    post(call);
  } catch (const std::bad_alloc&) {
    std::apply(std::move(call.handler), std::move(call.args));
  }
}

// Queues `handler(args...)` on `io_ex`; from there it is dispatched to the handler's own
// executor. The caller's stack never runs it (but see post_or_run).
template <typename Executor, typename Handler, typename... Args>
void post_completion(const Executor& io_ex, Handler handler, Args... args) {
  CompletionCall<Handler, Args...> call{io_ex, std::move(handler),
                                        std::make_tuple(std::move(args)...)};
  post_or_run(call, [&](auto& c) { boost::asio::post(io_ex, std::move(c)); });
}

// post_completion() to `io_ex`, an executor of the loop `gate` guards: once that loop has run
// for the last time (the gate refuses), the system executor delivers instead, so a completion
// reached late (a session destroyed after its context closed) still runs. Without a gate, as
// above.
template <typename Handler, typename... Args>
void post_completion(const std::shared_ptr<LoopGate>& gate,
                     const boost::asio::any_io_executor& io_ex, Handler handler, Args... args) {
  CompletionCall<Handler, Args...> call{io_ex, std::move(handler),
                                        std::make_tuple(std::move(args)...)};
  post_or_run(call, [&](auto& c) {
    if (!gate) return boost::asio::post(io_ex, std::move(c));
    if (gate->post(io_ex, c)) return;
    c.fallback = boost::asio::system_executor();
    boost::asio::post(boost::asio::system_executor(), std::move(c));
  });
}

}  // namespace ferry::detail
