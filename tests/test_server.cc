// A serving process for multi-process tests: puts one object per size given on the command
// line (pattern bytes, seed = index), prints "listening <port>" and one "ref <text>" per object,
// then serves until killed (or for 120 s at most).
// `ferry_test_server fetch ADDRESS REF...`: a fetching process instead; it fetches random refs
// of the list in a loop (8 in flight), prints "fetching" once the first one is issued, then per
// fetch "ok SIZE" (bytes checked), "bad SIZE" (bytes differ) or "err MESSAGE", until killed
// (120 s at most).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "tests/test_util.h"

// Each argument is a ref, or SEED@SIZE@REF: then the bytes are checked against the pattern.
int fetch_forever(int argc, char** argv) {
  ferry::Context ctx(ferry::test::client_options("test-fetcher"));
  auto peer = ctx.connect(argv[2]);
  if (!peer) return 2;
  struct Target {
    ferry::ObjectRef ref;
    uint64_t seed = 0;
    size_t size = 0;
    bool check = false;
  };
  std::vector<Target> targets;
  for (int i = 3; i < argc; ++i) {
    std::string arg = argv[i];
    Target t;
    if (auto at = arg.find('@');
        at != std::string::npos && arg.find('@', at + 1) != std::string::npos) {
      const auto at2 = arg.find('@', at + 1);
      t.seed = std::strtoull(arg.substr(0, at).c_str(), nullptr, 10);
      t.size = std::strtoull(arg.substr(at + 1, at2 - at - 1).c_str(), nullptr, 10);
      t.check = true;
      arg = arg.substr(at2 + 1);
    }
    t.ref = *ferry::ObjectRef::from_string(arg);
    targets.push_back(std::move(t));
  }
  std::mt19937_64 rng(::getpid());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool said = false;
  while (std::chrono::steady_clock::now() < end) {
    std::vector<std::pair<const Target*, ferry::FetchRequest>> reqs;
    for (int k = 0; k < 8; ++k) {
      const Target& t = targets[rng() % targets.size()];
      reqs.emplace_back(&t, peer->fetch(t.ref));
    }
    if (!said) {
      std::printf("fetching\n");
      std::fflush(stdout);
      said = true;
    }
    for (auto& [t, r] : reqs) {
      if (auto ec = r.wait(std::chrono::seconds(30))) {
        std::printf("err %s\n", ec.message().c_str());
      } else if (t->check) {
        const auto& got = r.result().tensors.at(0);
        const bool same =
            ferry::test::same_bytes(got, *ferry::test::make_pattern(t->size, t->seed));
        std::printf(same ? "ok %zu\n" : "bad %zu\n", got.size());
      }
    }
    std::fflush(stdout);
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
