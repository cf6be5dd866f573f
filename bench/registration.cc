#include "bench/registration.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/client.h"
#include "bench/measure.h"
#include "ferry.h"

namespace ferry::bench {
namespace {

using namespace std::chrono_literals;

std::string counters_json(Context& ctx) {
  auto c = rdma::registration_counters(ctx);
  if (!c) return "null";
  JsonLine j;
  j.add("registrations", c->registrations)
      .add("deregistrations", c->deregistrations)
      .add("hits", c->hits)
      .add("live", c->live);
  return j.str();
}

// One case: `count` tensors of `bytes`, views of one allocation or separate allocations.
int run_case(const RegistrationArgs& args, const char* name, uint64_t count, uint64_t bytes,
             bool views) {
  ContextOptions options;
  options.name = "bench-owner";
  options.rdma_memory_windows = args.memory_windows;
  auto owner = Context::create(options);
  if (!owner) return std::fprintf(stderr, "registration: %s\n", owner.error().message().c_str()), 1;
  auto port = (*owner)->listen(args.host + ":0");
  if (!port)
    return std::fprintf(stderr, "registration: listen: %s\n", port.error().message().c_str()), 1;

  // Owner memory, touched before any clock starts.
  std::vector<std::shared_ptr<std::byte[]>> blocks;
  const auto t_alloc = Clock::now();
  if (views) {
    blocks.emplace_back(new std::byte[count * bytes]);
    std::memset(blocks[0].get(), 7, count * bytes);
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      blocks.emplace_back(new std::byte[bytes]);
      std::memset(blocks.back().get(), 7, bytes);
    }
  }
  const double alloc_s = seconds_between(t_alloc, Clock::now());

  std::vector<ObjectRef> refs;
  refs.reserve(count);
  const auto t_put = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    PutOptions po;
    std::byte* p;
    std::shared_ptr<void> keep;
    if (views) {
      p = blocks[0].get() + i * bytes;
      po.region = {blocks[0].get(), count * bytes};
      keep = blocks[0];
    } else {
      p = blocks[i].get();
      keep = blocks[i];
    }
    auto ref = (*owner)->put({Tensor::bytes({p, bytes})}, keep, po);
    if (!ref)
      return std::fprintf(stderr, "registration: put: %s\n", ref.error().message().c_str()), 1;
    refs.push_back(std::move(*ref));
  }
  const double put_s = seconds_between(t_put, Clock::now());

  options.name = "bench-fetcher";
  auto fetcher = Context::create(options);
  if (!fetcher) return 1;
  auto peer = (*fetcher)->connect((*owner)->address());
  if (!peer)
    return std::fprintf(stderr, "registration: connect: %s\n", peer.error().message().c_str()), 1;
  // Fetch targets: views of one touched allocation.
  std::unique_ptr<std::byte[]> landing(new std::byte[count * bytes]);
  std::memset(landing.get(), 0, count * bytes);
  std::vector<MutableBuffer> targets;
  for (uint64_t i = 0; i < count; ++i) targets.push_back({landing.get() + i * bytes, bytes});

  // Single fetches of the first few objects, cold (their owner memory not yet registered) and
  // again warm after two full passes: the difference is what registering costs at first grant.
  const size_t sampled = static_cast<size_t>(std::min<uint64_t>(count, 10));
  uint64_t reissued = 0;  // fetches issued again after their data channel broke
  auto single = [&](size_t i) -> Result<double> {
    return fetch_each(*peer, {refs[i]}, {targets[i]}, 1, 600s, &reissued);
  };
  std::vector<double> cold;
  for (size_t i = 0; i < sampled; ++i) {
    auto t = single(i);
    if (!t)
      return std::fprintf(stderr, "registration: fetch: %s\n", t.error().message().c_str()), 1;
    cold.push_back(*t);
  }
  auto pass1 = fetch_each(*peer, refs, targets, args.inflight, 1800s, &reissued);
  if (!pass1)
    return std::fprintf(stderr, "registration: fetch: %s\n", pass1.error().message().c_str()), 1;
  auto pass2 = fetch_each(*peer, refs, targets, args.inflight, 1800s, &reissued);
  if (!pass2)
    return std::fprintf(stderr, "registration: fetch: %s\n", pass2.error().message().c_str()), 1;
  std::vector<double> warm;
  for (size_t i = 0; i < sampled; ++i) {
    auto t = single(i);
    if (!t)
      return std::fprintf(stderr, "registration: fetch: %s\n", t.error().message().c_str()), 1;
    warm.push_back(*t);
  }
  // The first object pays for its allocation's registration (all of it, for views); each later
  // registration (separate tensors; none for views) costs about what later cold fetches cost
  // over warm ones. Without RDMA nothing is registered: making objects fetchable is the put.
  std::vector<double> extra;
  for (size_t i = 1; i < sampled; ++i) extra.push_back(cold[i] - warm[i]);
  const double first_extra = std::max(0.0, cold[0] - warm[0]);
  const double later_extra = std::max(0.0, quantile(extra, 0.5));
  const auto owner_regs = rdma::registration_counters(**owner);
  double registration_s = put_s;
  if (owner_regs && owner_regs->registrations > 0) {
    registration_s +=
        first_extra + static_cast<double>(owner_regs->registrations - 1) * later_extra;
  }
  bool same = landing[0] == std::byte{7} && landing[count * bytes - 1] == std::byte{7};

  const double gb = static_cast<double>(count * bytes) / 1e9;
  JsonLine out;
  out.add("tool", "ferry")
      .add("bench", "registration")
      .add("case", name)
      .add("transport", peer->transport())
      .add("memory_windows", args.memory_windows ? 1 : 0)
      .add("count", count)
      .add("bytes", bytes)
      .add("alloc_s", alloc_s)
      .add("put_s", put_s)
      .add("first_cold_s", cold[0])
      .add("first_warm_s", warm[0])
      .add("later_extra_s", later_extra)
      .add("pass1_s", *pass1)
      .add("pass2_s", *pass2)
      .add("pass2_gbps", gb / *pass2)
      // Registration is lazy: the owner registers at the first grant of an object's memory.
      .add("registration_s", registration_s)
      .add("verified_ends", same ? 1 : 0)
      .add("reissued", reissued)
      .add_raw("owner_counters", counters_json(**owner))
      .add_raw("fetcher_counters", counters_json(**fetcher));
  std::printf("%s\n", out.str().c_str());
  std::fflush(stdout);
  (*fetcher)->close();
  (*owner)->close();
  return 0;
}

}  // namespace

int run_registration(const RegistrationArgs& args) {
  if (args.views > 0) {
    if (int rc = run_case(args, "views", args.views, args.view_bytes, true)) return rc;
  }
  if (args.tensors > 0) {
    if (int rc = run_case(args, "tensors", args.tensors, args.tensor_bytes, false)) return rc;
  }
  return 0;
}

}  // namespace ferry::bench
