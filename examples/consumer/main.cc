// The smallest complete ferry program: put a tensor, connect, fetch it back, check it.
// Built against the installed package by tests/consumer_test.sh.
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "ferry/ferry.h"

int main() {
  ferry::Context owner({.name = "owner"});
  auto port = owner.listen("127.0.0.1:0");
  if (!port) return std::fprintf(stderr, "listen: %s\n", port.error().message().c_str()), 1;

  auto weights = std::make_shared<std::vector<float>>(1 << 20);
  std::iota(weights->begin(), weights->end(), 0.0f);
  ferry::Tensor tensor{std::as_bytes(std::span(*weights)),
                       ferry::TensorMeta::dense({1024, 1024}, ferry::DType::kFloat32)};
  auto ref = owner.put({tensor}, weights);
  if (!ref) return std::fprintf(stderr, "put: %s\n", ref.error().message().c_str()), 1;

  ferry::Context reader({.name = "reader"});
  auto peer = reader.connect("127.0.0.1:" + std::to_string(*port));
  if (!peer) return std::fprintf(stderr, "connect: %s\n", peer.error().message().c_str()), 1;

  std::vector<float> out(weights->size());
  auto request = peer->fetch(*ref, {std::as_writable_bytes(std::span(out))});
  if (auto ec = request.wait(std::chrono::seconds(30))) {
    return std::fprintf(stderr, "fetch: %s\n", ec.message().c_str()), 1;
  }
  const bool same = std::memcmp(out.data(), weights->data(), out.size() * sizeof(float)) == 0;
  std::printf("consumer: fetched %zu bytes over %s: %s\n", out.size() * sizeof(float),
              peer->transport().c_str(), same ? "identical" : "DIFFERENT");
  return same ? 0 : 1;
}
