// A serving process for multi-process tests: puts one object per size given on the command
// line (pattern bytes, seed = index), prints "listening <port>" and one "ref <text>" per object,
// then serves until killed (or for 120 s at most).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/test_util.h"

int main(int argc, char** argv) {
  ferry::Context ctx({.name = "test-server"});
  auto port = ctx.listen(ferry::test::test_host() + ":0");
  if (!port) {
    std::fprintf(stderr, "listen: %s\n", port.error().message().c_str());
    return 2;
  }
  std::printf("listening %u\n", static_cast<unsigned>(*port));
  for (int i = 1; i < argc; ++i) {
    auto bytes = ferry::test::make_pattern(std::strtoull(argv[i], nullptr, 10), i);
    auto ref = ctx.put({ferry::Tensor::bytes(*bytes)}, bytes);
    if (!ref) return 3;
    std::printf("ref %s\n", ref->to_string().c_str());
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(120));
  return 0;
}
