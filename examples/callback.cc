// Callback style: fetch many objects at once; each completion arrives on the context's thread.
//   examples/ferry_example_callback
#include <atomic>
#include <cstdio>
#include <future>
#include <vector>

#include "ferry/ferry.h"

int main() {
  ferry::Context owner({.name = "owner"});
  auto port = owner.listen("127.0.0.1:0");
  if (!port) return 1;
  std::vector<ferry::ObjectRef> refs;
  for (int i = 0; i < 16; ++i) {
    auto bytes = std::make_shared<std::vector<std::byte>>(size_t{1} << (10 + i % 10), std::byte(i));
    refs.push_back(*owner.put({ferry::Tensor::bytes(*bytes)}, bytes));
  }

  ferry::Context reader({.name = "reader"});
  auto peer = reader.connect("127.0.0.1:" + std::to_string(*port));
  if (!peer) return std::fprintf(stderr, "connect: %s\n", peer.error().message().c_str()), 1;

  std::atomic<int> left{static_cast<int>(refs.size())}, failed{0};
  std::promise<void> all_done;
  for (const auto& ref : refs) {
    peer->async_fetch(ref, [&](boost::system::error_code ec, ferry::FetchResult result) {
      if (ec) {
        std::fprintf(stderr, "fetch: %s\n", ec.message().c_str());
        ++failed;
      } else {
        std::printf("object %llu: %llu bytes in %.3f ms\n",
                    static_cast<unsigned long long>(result.ref.object_id),
                    static_cast<unsigned long long>(result.bytes), result.elapsed.count() / 1e6);
      }
      if (--left == 0) all_done.set_value();
    });
  }
  if (all_done.get_future().wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return std::fprintf(stderr, "timed out\n"), 1;
  }
  return failed == 0 ? 0 : 1;
}
