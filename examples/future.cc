// std::future style, and the TransportManager-style FetchRequest with wait(timeout) and abort.
//   examples/ferry_example_future
#include <boost/asio/use_future.hpp>
#include <cstdio>
#include <vector>

#include "ferry/ferry.h"

int main() {
  using namespace std::chrono_literals;
  ferry::Context owner({.name = "owner"});
  auto port = owner.listen("127.0.0.1:0");
  if (!port) return 1;
  auto kv_cache = std::make_shared<std::vector<std::byte>>(64 << 20, std::byte{7});
  auto ref = owner.put({ferry::Tensor::bytes(*kv_cache)}, kv_cache);

  ferry::Context reader({.name = "reader"});
  auto peer = reader.connect("127.0.0.1:" + std::to_string(*port));
  if (!peer) return 1;

  // 1. use_future: the future throws boost::system::system_error on failure.
  std::future<ferry::FetchResult> f = peer->async_fetch(*ref, boost::asio::use_future);
  if (f.wait_for(30s) != std::future_status::ready) return 1;
  try {
    std::printf("future: %llu bytes\n", static_cast<unsigned long long>(f.get().bytes));
  } catch (const boost::system::system_error& e) {
    std::fprintf(stderr, "fetch failed: %s (%s scope)\n", e.what(),
                 std::string(ferry::scope_name(ferry::scope_of(e.code()))).c_str());
    return 1;
  }

  // 2. FetchRequest: wait with a timeout, abort if it takes too long.
  std::vector<std::byte> target(kv_cache->size());
  ferry::FetchRequest request = peer->fetch(*ref, {ferry::MutableBuffer(target)});
  std::error_code ec = request.wait(10s);
  if (ec == ferry::errc::timed_out) {
    request.abort();          // completes with errc::aborted; target is ours again after wait
    ec = request.wait(-1ms);  // returns promptly: abort completes it
  }
  std::printf("request: %s\n", ec ? ec.message().c_str() : "done");
  return ec ? 1 : 0;
}
