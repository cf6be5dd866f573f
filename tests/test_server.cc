// A serving process for multi-process tests: puts one object per size given on the command
// line (pattern bytes, seed = index), prints "listening <port>" and one "ref <text>" per object,
// then serves until killed (or for 120 s at most).
// `ferry_test_server fetch ADDRESS REF...`: a fetching process instead; it fetches the refs in
// a loop (8 in flight), prints "fetching" once the first one is issued, until killed (120 s).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/test_util.h"

int fetch_forever(int argc, char** argv) {
  ferry::Context ctx(ferry::test::client_options("test-fetcher"));
  auto peer = ctx.connect(argv[2]);
  if (!peer) return 2;
  std::vector<ferry::ObjectRef> refs;
  for (int i = 3; i < argc; ++i) refs.push_back(*ferry::ObjectRef::from_string(argv[i]));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool said = false;
  while (std::chrono::steady_clock::now() < end) {
    std::vector<ferry::FetchRequest> reqs;
    for (int k = 0; k < 8; ++k) reqs.push_back(peer->fetch(refs[k % refs.size()]));
    if (!said) {
      std::printf("fetching\n");
      std::fflush(stdout);
      said = true;
    }
    for (auto& r : reqs) r.wait(std::chrono::seconds(30));
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "fetch") return fetch_forever(argc, argv);
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
