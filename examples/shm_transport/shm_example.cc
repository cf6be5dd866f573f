// Two processes on one host, one object store, the SHM transport.
//
//   shm_example owner COUNT [--exclusive|--prefer] [--no-shm]
//       registers SHM, listens on 127.0.0.1, puts COUNT objects (sizes 1 B .. 64 MiB, seeded),
//       prints "listening PORT", one "ref TEXT" per object and "ready"; then reads commands on
//       stdin: "release" (drop every object: GC unlinks their segments; prints "released"),
//       "quit" (or end of input).
//   shm_example fetch PORT REFFILE [--no-shm] [--late] [--abort] [--timeout-ms N]
//                     [--copy-step BYTES]
//       registers SHM (unless --no-shm; with --late only after connecting), fetches every ref in
//       REFFILE (4 in flight), verifies every byte, prints one line per transport used.
//       --copy-step: SHM's ShmOptions::copy_step (default $SHM_COPY_STEP, else 8 MiB).
//       Exit: 0 all good, 3 a fetch failed (its error printed), 4 a byte differed.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm_transport.h"

namespace {

using namespace std::chrono_literals;

// The bytes of object `i`: size from a log-uniform spread over 1 B .. 64 MiB (mostly small),
// content from a cheap generator, so both processes can produce and check them.
size_t object_size(size_t i) {
  if (i % 100 == 99) return size_t{1} << (16 + (i / 100) % 11);  // 64 KiB .. 64 MiB
  std::mt19937_64 rng(i);
  return 1 + rng() % (size_t{1} << (rng() % 17));  // 1 B .. 64 KiB
}

void fill(std::byte* p, size_t n, size_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + 7;
  for (size_t k = 0; k < n; ++k) {
    if ((k & 7) == 0) x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[k] = static_cast<std::byte>(x >> ((k & 7) * 8));
  }
}

bool has(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], flag)) return true;
  }
  return false;
}

// The argument after `flag`, or null.
const char* value_of(int argc, char** argv, const char* flag) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], flag)) return argv[i + 1];
  }
  return nullptr;
}

int owner(int argc, char** argv) {
  if (!has(argc, argv, "--no-shm")) shm_example::register_shm_transport();
  ferry::ContextOptions options = ferry::ContextOptions::from_environment();
  options.name = "shm-owner";
  ferry::Context ctx(options);
  auto port = ctx.listen("127.0.0.1:0");
  if (!port) return 2;
  std::printf("listening %u\n", static_cast<unsigned>(*port));
  const size_t count = std::strtoull(argv[2], nullptr, 10);
  ferry::PutOptions put;
  if (has(argc, argv, "--exclusive") || has(argc, argv, "--prefer")) put.transport = "SHM";
  put.exclusive = has(argc, argv, "--exclusive");
  std::vector<ferry::ObjectRef> refs;
  for (size_t i = 0; i < count; ++i) {
    auto bytes = std::make_shared<std::vector<std::byte>>(object_size(i));
    fill(bytes->data(), bytes->size(), i);
    auto ref = ctx.put({ferry::Tensor::bytes(*bytes)}, bytes, put);
    if (!ref) return std::fprintf(stderr, "put: %s\n", ref.error().message().c_str()), 2;
    refs.push_back(*ref);
    std::printf("ref %s\n", ref->to_string().c_str());
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line) && line != "quit";) {
    if (line == "release") {
      for (const auto& r : refs) ctx.release(r);
      refs.clear();
      std::printf("released\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

int fetch(int argc, char** argv) {
  const bool shm = !has(argc, argv, "--no-shm");
  const bool late = has(argc, argv, "--late");
  if (shm && !late) shm_example::register_shm_transport();
  // [options-use]
  // The environment's options ($FERRY_*, and SHM's own once it is registered), then this
  // program's: with --copy-step BYTES, SHM copies in steps of that size.
  ferry::ContextOptions options = ferry::ContextOptions::from_environment();
  options.name = "shm-fetcher";
  if (const char* step = value_of(argc, argv, "--copy-step")) {
    auto& shm_options = options.transport_options_for<shm_example::ShmOptions>(shm_example::kName);
    shm_options.copy_step = std::strtoull(step, nullptr, 10);
  }
  ferry::Context ctx(options);
  // [options-use]
  auto peer = ctx.connect(std::string("127.0.0.1:") + argv[2]);
  if (!peer) return std::fprintf(stderr, "connect: %s\n", peer.error().message().c_str()), 2;
  std::fprintf(stderr, "connected\n");  // tests wait for this before breaking things
  if (shm && late) {
    // Registered after connecting: the context picks it up and tells the peer.
    shm_example::register_shm_transport();
    for (int i = 0; i < 1000 && !peer->info().find_transport("SHM"); ++i) {
      std::this_thread::sleep_for(2ms);
    }
  }
  std::vector<ferry::ObjectRef> refs;
  std::ifstream in(argv[3]);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("ref ", 0) == 0) refs.push_back(*ferry::ObjectRef::from_string(line.substr(4)));
  }
  std::map<std::string, size_t> by_transport;
  size_t next = 0;
  std::vector<std::pair<size_t, ferry::FetchRequest>> inflight;
  auto finish = [&](size_t i, ferry::FetchRequest& req) -> int {
    auto ec = req.wait(120s);
    if (ec) {
      std::printf("fetch %zu failed: %s (%s)\n", i, ec.message().c_str(),
                  std::string(ferry::scope_name(ferry::scope_of(ec))).c_str());
      return 3;
    }
    const auto& r = req.result();
    std::vector<std::byte> want(object_size(i));
    fill(want.data(), want.size(), i);
    if (r.tensors[0].size() != want.size() ||
        (!want.empty() && std::memcmp(r.tensors[0].data(), want.data(), want.size()))) {
      std::printf("object %zu differs\n", i);
      return 4;
    }
    ++by_transport[r.transport];
    return 0;
  };
  if (has(argc, argv, "--abort")) {
    // Start every fetch, abort them all at once: each ends exactly once, aborted or done.
    std::vector<ferry::FetchRequest> reqs;
    for (const auto& r : refs) reqs.push_back(peer->fetch(r));
    for (auto& r : reqs) r.abort();
    size_t aborted = 0;
    for (auto& r : reqs) {
      auto ec = r.wait(60s);
      if (ec && ec != ferry::errc::aborted)
        return std::printf("abort: %s\n", ec.message().c_str()), 3;
      aborted += ec == ferry::errc::aborted;
    }
    std::printf("aborted %zu of %zu\n", aborted, reqs.size());
    return 0;
  }
  for (; next < refs.size() || !inflight.empty();) {
    while (next < refs.size() && inflight.size() < 4) {
      inflight.emplace_back(next, peer->fetch(refs[next]));
      ++next;
    }
    auto [i, req] = inflight.front();
    inflight.erase(inflight.begin());
    if (int rc = finish(i, req)) return rc;
  }
  for (const auto& [t, n] : by_transport) std::printf("fetched %zu over %s\n", n, t.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && !std::strcmp(argv[1], "owner")) return owner(argc, argv);
  if (argc >= 4 && !std::strcmp(argv[1], "fetch")) return fetch(argc, argv);
  std::fprintf(stderr, "usage: shm_example owner COUNT [...] | fetch PORT REFFILE [...]\n");
  return 1;
}
