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

// Queues `handler(args...)` on `io_ex`; from there it is dispatched to the handler's own
// executor. The caller's stack never runs it.
template <typename Executor, typename Handler, typename... Args>
void post_completion(const Executor& io_ex, Handler handler, Args... args) {
  boost::asio::post(io_ex, CompletionCall<Handler, Args...>{io_ex, std::move(handler),
                                                            std::make_tuple(std::move(args)...)});
}

// post_completion() to `io_ex`, an executor of the loop `gate` guards: once that loop has run
// for the last time (the gate refuses), the system executor delivers instead, so a completion
// reached late (a session destroyed after its context closed) still runs. Without a gate, as
// above. Out of memory to queue it (Asio allocates each posted operation before it takes the
// function, so `call` still holds the handler then), the handler runs here, on this thread: the
// one case where a completion runs inline, since a completion is never lost.
template <typename Handler, typename... Args>
void post_completion(const std::shared_ptr<LoopGate>& gate,
                     const boost::asio::any_io_executor& io_ex, Handler handler, Args... args) {
  CompletionCall<Handler, Args...> call{io_ex, std::move(handler),
                                        std::make_tuple(std::move(args)...)};
  try {
    if (!gate) return boost::asio::post(io_ex, std::move(call));
    if (gate->post(io_ex, call)) return;
    call.fallback = boost::asio::system_executor();
    boost::asio::post(boost::asio::system_executor(), std::move(call));
  } catch (const std::bad_alloc&) {
    std::apply(std::move(call.handler), std::move(call.args));
  }
}

}  // namespace ferry::detail
