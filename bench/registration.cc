#include "bench/registration.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/client.h"
#include "bench/measure.h"
#include "ferry/ferry.h"

namespace ferry::bench {
namespace {

using namespace std::chrono_literals;

// Says why a case stopped; the exit code.
std::string counters_json(Context& ctx) {
  auto c = rdma::registration_counters(ctx);
  if (!c) return "null";
  JsonLine j;
  j.add("registrations", c->registrations)
      .add("registration_s", static_cast<double>(c->registration_ns) / 1e9)
      .add("deregistrations", c->deregistrations)
      .add("hits", c->hits)
      .add("live", c->live);
  return j.str();
}

// One case: `count` tensors of `bytes`, views of one allocation or separate allocations,
// fetched into views of one allocation of the fetcher's, or (`pool`) into memory ferry allocates
// from its receive pool.
int run_case(const RegistrationArgs& args, const char* name, uint64_t count, uint64_t bytes,
             bool views, bool pool = false) {
  ContextOptions options = ContextOptions::from_environment();
  options.name = "bench-owner";
  options.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).grants =
      rdma::parse_rdma_grants(args.grants).value_or(rdma::RdmaGrants::automatic);
  auto owner = Context::create(options);
  if (!owner) return report_failure("registration", "", owner.error());
  auto port = (*owner)->listen(args.host + ":0");
  if (!port) return report_failure("registration", "listen", port.error());

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
    if (!ref) return report_failure("registration", "put", ref.error());
    refs.push_back(std::move(*ref));
  }
  const double put_s = seconds_between(t_put, Clock::now());

  options.name = "bench-fetcher";
  auto fetcher = Context::create(options);
  if (!fetcher) return report_failure("registration", "", fetcher.error());
  auto peer = (*fetcher)->connect((*owner)->address());
  if (!peer) return report_failure("registration", "connect", peer.error());
  // Fetch targets: views of one touched allocation; none when ferry allocates.
  std::unique_ptr<std::byte[]> landing(new std::byte[pool ? 1 : count * bytes]);
  std::vector<MutableBuffer> targets;
  if (!pool) {
    std::memset(landing.get(), 0, count * bytes);
    for (uint64_t i = 0; i < count; ++i) targets.push_back({landing.get() + i * bytes, bytes});
  }
  const std::vector<MutableBuffer> first_target =
      pool ? std::vector<MutableBuffer>{} : std::vector<MutableBuffer>{targets[0]};

  // The first object alone, cold (its owner memory not yet registered) and again warm after
  // two full passes: what a first fetch pays.
  uint64_t reissued = 0;  // fetches issued again after their data channel broke
  auto first = [&]() -> Result<double> {
    return fetch_each(*peer, {refs[0]}, first_target, 1, 600s, &reissued);
  };
  auto cold = first();
  if (!cold) return report_failure("registration", "fetch", cold.error());
  auto pass1 = fetch_each(*peer, refs, targets, args.inflight, 1800s, &reissued);
  if (!pass1) return report_failure("registration", "fetch", pass1.error());
  auto pass2 = fetch_each(*peer, refs, targets, args.inflight, 1800s, &reissued);
  if (!pass2) return report_failure("registration", "fetch", pass2.error());
  auto warm = first();
  if (!warm) return report_failure("registration", "fetch", warm.error());
  // Making the objects fetchable: the put, and the owner's registrations, which it makes lazily,
  // at the first grant of an object's memory (timed around each ibv_reg_mr). Without RDMA
  // nothing is registered.
  const auto owner_regs = rdma::registration_counters(**owner);
  const double registration_s =
      put_s + (owner_regs ? static_cast<double>(owner_regs->registration_ns) / 1e9 : 0.0);
  bool same = false;
  if (pool) {
    auto last = peer->fetch(refs[count - 1]);
    same = !last.wait(std::chrono::milliseconds(600000)) &&
           last.result().tensors[0][0] == std::byte{7} &&
           last.result().tensors[0][bytes - 1] == std::byte{7};
  } else {
    same = landing[0] == std::byte{7} && landing[count * bytes - 1] == std::byte{7};
  }

  const double gb = static_cast<double>(count * bytes) / 1e9;
  JsonLine out;
  out.add("tool", "ferry")
      .add("bench", "registration")
      .add("case", name)
      .add("transport", peer->transport())
      .add("grants", args.grants)
      .add("count", count)
      .add("bytes", bytes)
      .add("alloc_s", alloc_s)
      .add("put_s", put_s)
      .add("first_cold_s", *cold)
      .add("first_warm_s", *warm)
      .add("pass1_s", *pass1)
      .add("pass2_s", *pass2)
      .add("pass2_gbps", gb / *pass2)
      .add("registration_s", registration_s)
      .add("verified_ends", same ? 1 : 0)
      .add("reissued", reissued)
      .add_raw("owner_counters", counters_json(**owner))
      .add_raw("fetcher_counters", counters_json(**fetcher))
      .add("fetches", 2 * count + 2)
      .add("pool_regions", (*fetcher)->pool_stats().regions_created);
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
  if (args.views > 0 && args.pool) {
    if (int rc = run_case(args, "pool", args.views, args.view_bytes, true, true)) return rc;
  }
  return 0;
}

}  // namespace ferry::bench
