// The README's library example, whole: an owner puts a tensor, a reader fetches it by ref, into
// memory ferry allocates and into its own buffer, with a deadline. In real use the two contexts
// live in different processes (on different machines) and the ref travels as text.
//   examples/ferry_example_quickstart
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "ferry/ferry.h"

int main() {
  using namespace std::chrono_literals;
  // The owner: listen first (refs name the listener as their owner), then put.
  ferry::Context owner({.name = "owner"});
  if (!owner.listen("127.0.0.1:0")) return 1;
  auto weights = std::make_shared<std::vector<float>>(1024 * 1024, 0.5f);
  auto ref =
      owner.put({ferry::Tensor{std::as_bytes(std::span(*weights)),
                               ferry::TensorMeta::dense({1024, 1024}, ferry::DType::kFloat32)}},
                weights);  // `weights` stays alive while the store serves it
  if (!ref) return std::fprintf(stderr, "put: %s\n", ref.error().message().c_str()), 1;
  const std::string wire = ref->to_string();  // send this to the reader any way you like

  // The reader: parse the ref, connect to its owner, fetch.
  ferry::Context reader({.name = "reader"});
  auto r = ferry::ObjectRef::from_string(wire);
  if (!r) return 1;
  auto peer = reader.connect(r->owner);
  if (!peer) return std::fprintf(stderr, "connect: %s\n", peer.error().message().c_str()), 1;

  // 1. Into memory ferry allocates (its receive pool): the result owns it.
  ferry::FetchRequest a = peer->fetch(*r);
  if (auto ec = a.wait(30s)) return std::fprintf(stderr, "fetch: %s\n", ec.message().c_str()), 1;
  const ferry::FetchResult& result = a.result();
  auto floats = reinterpret_cast<const float*>(result.tensors[0].data());
  std::printf("fetched %llu bytes over %s, first value %g\n",
              static_cast<unsigned long long>(result.bytes), result.transport.c_str(), floats[0]);

  // 2. Into the caller's buffer, with a deadline carried by the fetch itself.
  std::vector<float> mine(1024 * 1024);
  ferry::FetchRequest b = peer->fetch(*r, {std::as_writable_bytes(std::span(mine))},
                                      ferry::FetchOptions{.timeout = 10s});
  if (auto ec = b.wait(-1ms)) {  // the fetch's own deadline bounds this wait
    std::fprintf(stderr, "fetch: %s (%s scope)\n", ec.message().c_str(),
                 std::string(ferry::scope_name(ferry::scope_of(ec))).c_str());
    return 1;
  }
  if (mine[12345] != 0.5f) return 1;

  owner.release(*ref);  // the store lets go once no peer holds it
  std::printf("ok\n");
  return 0;
}
