// C++20 coroutine style: connect and fetch with co_await.
//   examples/ferry_example_coroutine
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cstdio>
#include <vector>

#include "ferry/ferry.h"

namespace asio = boost::asio;

asio::awaitable<uint64_t> pull_all(ferry::Context& ctx, std::string address,
                                   std::vector<ferry::ObjectRef> refs) {
  ferry::Peer peer = co_await ctx.async_connect(address, asio::use_awaitable);
  uint64_t total = 0;
  for (const auto& ref : refs) {
    ferry::FetchResult r = co_await peer.async_fetch(ref, asio::use_awaitable);  // throws on error
    total += r.bytes;
  }
  co_return total;
}

int main() {
  ferry::Context owner({.name = "owner"});
  auto port = owner.listen("127.0.0.1:0");
  if (!port) return 1;
  std::vector<ferry::ObjectRef> refs;
  for (int layer = 0; layer < 8; ++layer) {
    auto w = std::make_shared<std::vector<float>>(256 * 1024, float(layer));
    ferry::Tensor t{std::as_bytes(std::span(*w)),
                    ferry::TensorMeta::dense({512, 512}, ferry::DType::kFloat32)};
    refs.push_back(*owner.put({t}, w));
  }
  ferry::Context reader({.name = "reader"});
  auto result = asio::co_spawn(reader.io_context(),
                               pull_all(reader, "127.0.0.1:" + std::to_string(*port), refs),
                               asio::use_future);
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) return 1;
  try {
    std::printf("coroutine: fetched %llu bytes\n", static_cast<unsigned long long>(result.get()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
