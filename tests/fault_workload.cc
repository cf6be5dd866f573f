#include "tests/fault_workload.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "ferry/rdma/rdma.h"
#include "tests/child_process.h"
#include "tests/test_util.h"

namespace ferry::test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Log-uniform in [0, max]: as many tiny objects as large ones.
size_t random_size(std::mt19937_64& rng, size_t max) {
  std::uniform_real_distribution<double> d(0, std::log(static_cast<double>(max) + 1));
  return std::min(max, static_cast<size_t>(std::exp(d(rng))) - 1);
}

milliseconds random_delay(std::mt19937_64& rng, milliseconds max) {
  return milliseconds(10 + rng() % static_cast<uint64_t>(std::max<int64_t>(1, max.count() - 10)));
}

// The names in /dev/shm (sorted). Any process's: the check that uses it assumes no other test
// creates entries meanwhile (ctest RESOURCE_LOCK dev_shm).
std::vector<std::string> shm_entries() {
  std::error_code ec;
  std::vector<std::string> names;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct Object {
  ObjectRef ref;
  size_t size;
  uint64_t seed;
  std::shared_ptr<std::vector<std::byte>> bytes;
};

class Workload {
 public:
  explicit Workload(const WorkloadOptions& o) : o_(o), rng_(o.seed) {}

  WorkloadReport run();

 private:
  void problem(std::string what) {
    std::lock_guard lock(mu_);
    if (report_.problems.size() < 40) report_.problems.push_back(std::move(what));
  }
  template <typename F>
  void count(F f) {
    std::lock_guard lock(mu_);
    f(report_);
  }
  uint64_t seed() {
    std::lock_guard lock(mu_);
    return rng_();
  }
  void kill_fetchers_loop();
  void kill_owners_loop(Context& ctx);
  void honest_loop(Context& ctx);
  void abort_loop(Context& ctx);
  void check_rdma_clean(Context& ctx, const std::string& who);

  const WorkloadOptions o_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  WorkloadReport report_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<Server> server_;
  std::vector<Object> objects_;
};

void Workload::kill_fetchers_loop() {
  std::mt19937_64 rng(seed());
  std::vector<std::string> args{"fetch", server_->address()};
  for (const auto& obj : objects_) {
    args.push_back(std::to_string(obj.seed) + "@" + std::to_string(obj.size) + "@" +
                   obj.ref.to_string());
  }
  while (!stop_) {
    std::vector<std::unique_ptr<ChildProcess>> kids;
    for (int k = 0; k < o_.fetcher_children; ++k) {
      kids.push_back(std::make_unique<ChildProcess>(args, "fetching"));
      if (!kids.back()->ready) return problem("a fetching child did not start");
    }
    // Kill at a random point: after a random number of transfers (or a random time, for
    // rounds where transfers are slow).
    const size_t kill_after = rng() % o_.kill_every;
    const auto kill_at = Clock::now() + random_delay(rng, scaled(o_.max_kill_delay));
    size_t done = 0;
    std::string line;
    while (done < kill_after && Clock::now() < kill_at) {
      for (auto& kid : kids) {
        // Not a line past kill_after: a child that reports faster than a millisecond a line
        // would otherwise keep this loop reading, and the run end, before any kill.
        while (done < kill_after && kid->read_line(line, milliseconds(1))) {
          if (line.rfind("ok ", 0) == 0) {
            ++done;
            const uint64_t n = std::strtoull(line.c_str() + 3, nullptr, 10);
            count([&](WorkloadReport& r) {
              ++r.child_transfers;
              r.bytes_checked += n;
            });
          } else if (line.rfind("bad", 0) == 0) {
            problem("a fetching child received wrong bytes (" + line + ")");
          } else if (line.rfind("err ", 0) == 0) {
            problem("a fetching child's fetch failed against a live server: " + line.substr(4));
          }
        }
      }
    }
    for (auto& kid : kids) kid->kill(SIGKILL);

    count([&](WorkloadReport& r) { r.fetcher_kills += kids.size(); });
  }
}

void Workload::kill_owners_loop(Context& ctx) {
  std::mt19937_64 rng(seed());
  while (!stop_) {
    std::vector<std::string> sizes;
    for (int i = 0; i < 8; ++i) sizes.push_back(std::to_string(random_size(rng, o_.max_size)));
    ChildProcess owner(sizes);
    if (!owner.ready || owner.refs.size() != sizes.size()) {
      return problem("an owner child did not start");
    }
    auto peer = ctx.connect(owner.address);
    if (!peer) return problem("cannot connect to an owner child: " + peer.error().message());
    // Kill after a random number of fetches issued, with 16 in flight (or at a random time).
    const size_t kill_after = 1 + rng() % o_.kill_every;
    const auto kill_at = Clock::now() + random_delay(rng, scaled(o_.max_kill_delay));
    size_t issued = 0;
    std::deque<std::pair<size_t, FetchRequest>> inflight;
    auto settle = [&](size_t idx, FetchRequest& r, bool owner_dead) {
      if (!r.done()) {
        problem("a fetch from a killed owner did not complete within " +
                std::to_string(scaled(milliseconds(15000)).count()) + " ms (hang)");
        r.abort();
        return;
      }
      if (auto ec = r.wait(milliseconds(0))) {
        if (!owner_dead) problem("a fetch from a live owner failed: " + ec.message());
        if (scope_of(ec) != Scope::peer) {
          problem("a fetch from a dead owner failed outside the peer scope: " + ec.message());
        }
        return;
      }
      const auto& got = r.result().tensors.at(0);
      const size_t size = std::stoull(sizes[idx]);
      if (!same_bytes(got, *make_pattern(size, idx + 1))) {
        problem("wrong bytes from an owner child (" + std::to_string(size) + " bytes)");
      }
      count([&](WorkloadReport& rep) {
        ++rep.owner_fetches_ok;
        rep.bytes_checked += size;
      });
    };
    while (issued < kill_after && Clock::now() < kill_at && !stop_) {
      while (inflight.size() < 16 && issued < kill_after) {
        const size_t idx = rng() % sizes.size();
        inflight.emplace_back(idx, peer->fetch(owner.refs[idx]));
        ++issued;
        count([](WorkloadReport& r) { ++r.owner_fetches; });
      }
      if (issued == kill_after) break;  // kill with these in flight
      if (inflight.front().second.done()) {
        settle(inflight.front().first, inflight.front().second, false);
        inflight.pop_front();
      } else {
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
    owner.kill(SIGKILL);
    count([](WorkloadReport& r) { ++r.owner_kills; });
    // Every future on the surviving side completes, value or error, within a bound.
    const auto deadline = Clock::now() + scaled(milliseconds(15000));
    for (auto& [idx, r] : inflight) {
      r.wait(std::chrono::duration_cast<milliseconds>(
          std::max(Clock::duration::zero(), deadline - Clock::now())));
      settle(idx, r, true);
    }
  }
}

void Workload::honest_loop(Context& ctx) {
  std::mt19937_64 rng(seed());
  auto peer = ctx.connect(server_->address());
  if (!peer) return problem("the honest peer cannot connect: " + peer.error().message());
  while (!stop_) {
    const Object& obj = objects_[rng() % objects_.size()];
    auto r = peer->fetch(obj.ref);
    if (auto ec = r.wait(scaled(milliseconds(30000)))) {
      problem("the honest peer's fetch failed: " + ec.message());
      if (!peer->is_open()) return;
      continue;
    }
    if (!same_bytes(r.result().tensors.at(0), *obj.bytes))
      problem("the honest peer got wrong bytes");
    count([&](WorkloadReport& rep) {
      ++rep.honest_fetches;
      rep.bytes_checked += obj.size;
    });
  }
}

void Workload::abort_loop(Context& ctx) {
  std::mt19937_64 rng(seed());
  auto peer = ctx.connect(server_->address());
  if (!peer) return problem("the aborting peer cannot connect: " + peer.error().message());
  while (!stop_) {
    std::vector<std::pair<const Object*, FetchRequest>> reqs;
    for (int i = 0; i < 16; ++i) {
      const Object& obj = objects_[rng() % objects_.size()];
      FetchOptions fo;
      const int kind = static_cast<int>(rng() % 3);
      if (kind == 1) fo.timeout = milliseconds(1 + rng() % 5);
      reqs.emplace_back(&obj, peer->fetch(obj.ref, {}, fo));
      if (kind == 2) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
        reqs.back().second.abort();
      }
    }
    for (auto& [obj, r] : reqs) {
      const auto ec = r.wait(scaled(milliseconds(30000)));
      count([](WorkloadReport& rep) { ++rep.abort_fetches; });
      if (!r.done()) {
        problem("an aborted or deadlined fetch did not complete within " +
                std::to_string(scaled(milliseconds(30000)).count()) + " ms (hang)");
      } else if (ec == errc::aborted) {
        count([](WorkloadReport& rep) { ++rep.aborted; });
      } else if (ec == errc::timed_out) {
        count([](WorkloadReport& rep) { ++rep.timed_out; });
      } else if (ec) {
        problem("an aborting peer's fetch failed unexpectedly: " + ec.message());
      } else if (!same_bytes(r.result().tensors.at(0), *obj->bytes)) {
        problem("wrong bytes in a fetch that raced an abort or deadline");
      }
    }
  }
}

void Workload::check_rdma_clean(Context& ctx, const std::string& who) {
  if (!rdma::registration_counters(ctx)) return;
  // Queue pairs are destroyed in the background (ferry/rdma/reaper.h); rxe can take its retry
  // budget to let go of one whose peer died.
  const bool clean = eventually(
      [&] {
        auto c = rdma::registration_counters(ctx);
        return c->live == 0 && c->windows == 0 && c->queue_pairs == 0;
      },
      milliseconds(90000));
  if (!clean) {
    auto c = rdma::registration_counters(ctx);
    problem(who + " leaks RDMA resources: " + std::to_string(c->live) + " registrations, " +
            std::to_string(c->windows) + " memory windows, " + std::to_string(c->queue_pairs) +
            " queue pairs");
  }
}

WorkloadReport Workload::run() {
  const auto t0 = Clock::now();
  const auto shm_before = shm_entries();
  server_ = std::make_unique<Server>(client_options("soak-server"));
  for (size_t i = 0; i < 24; ++i) {
    Object obj;
    obj.size = random_size(rng_, o_.max_size);
    obj.seed = 1000 + i;
    obj.bytes = make_pattern(obj.size, obj.seed);
    obj.ref = server_->put(obj.bytes);
    objects_.push_back(std::move(obj));
  }
  const size_t fds_before = open_fds();
  {
    auto honest = std::make_unique<Context>(client_options("honest"));
    auto owners = std::make_unique<Context>(client_options("owner-fetcher"));
    auto aborting = std::make_unique<Context>(client_options("aborting"));
    // A fixed array, not a growing vector: GCC 12 sees a bogus out-of-bounds access in
    // vector<thread>'s reallocation (-Warray-bounds).
    std::array<std::thread, 4> threads;
    threads[0] = std::thread([&] { honest_loop(*honest); });
    if (o_.kill_fetchers) threads[1] = std::thread([&] { kill_fetchers_loop(); });
    if (o_.kill_owners) threads[2] = std::thread([&] { kill_owners_loop(*owners); });
    if (o_.aborts) threads[3] = std::thread([&] { abort_loop(*aborting); });
    auto last_print = Clock::now();
    auto last_progress = Clock::now();
    size_t last_transfers = 0;
    for (;;) {
      std::this_thread::sleep_for(milliseconds(50));
      const auto elapsed = Clock::now() - t0;
      size_t transfers;
      {
        std::lock_guard lock(mu_);
        transfers = report_.transfers();
      }
      if (o_.duration.count() > 0 && Clock::now() - last_print > std::chrono::seconds(10)) {
        last_print = Clock::now();
        std::lock_guard lock(mu_);
        std::printf("soak: %.0f s: %s\n", std::chrono::duration<double>(elapsed).count(),
                    report_.summary().c_str());
        std::fflush(stdout);
      }
      if (o_.duration.count() > 0 ? elapsed >= o_.duration : transfers >= o_.transfers) break;
      // Done by count, however slow the machine; only a run that stops making progress fails.
      if (transfers != last_transfers) {
        last_transfers = transfers;
        last_progress = Clock::now();
      } else if (Clock::now() - last_progress >= scaled(o_.stall)) {
        problem("no transfer completed for " + std::to_string(scaled(o_.stall).count()) +
                " ms (a hang; " + std::to_string(transfers) + " transfers before it)");
        break;
      }
    }
    stop_ = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    // The fetching side of the owner kills: its peers are gone, nothing of theirs stays.
    if (!eventually([&] { return owners->peer_count() == 0; }, milliseconds(15000))) {
      problem("sessions to killed owners were not dropped");
    }
    check_rdma_clean(*owners, "the fetcher of killed owners");
  }
  // The owner side of the fetcher kills.
  const bool clean = eventually(
      [&] {
        if (server_->ctx.peer_count() != 0 || open_fds() != fds_before) return false;
        for (const auto& obj : objects_) {
          if (server_->ctx.store().counts(obj.ref.object_id)->pins != 0) return false;
        }
        return true;
      },
      milliseconds(15000));
  if (!clean) {
    problem(
        "the server did not return to its baseline: " + std::to_string(server_->ctx.peer_count()) +
        " sessions, " + std::to_string(open_fds()) + "/" + std::to_string(fds_before) + " fds");
  }
  for (const auto& obj : objects_) server_->ctx.release(obj.ref);
  check_rdma_clean(server_->ctx, "the server");
  server_.reset();
  if (const auto shm_after = shm_entries(); shm_after != shm_before) {
    std::vector<std::string> added, gone;
    std::set_difference(shm_after.begin(), shm_after.end(), shm_before.begin(), shm_before.end(),
                        std::back_inserter(added));
    std::set_difference(shm_before.begin(), shm_before.end(), shm_after.begin(), shm_after.end(),
                        std::back_inserter(gone));
    const auto list = [](const std::vector<std::string>& v) {
      std::string out;
      for (size_t i = 0; i < v.size() && i < 5; ++i) out += (i ? ", " : "") + v[i];
      return out + (v.size() > 5 ? ", ..." : "");
    };
    problem("/dev/shm entries changed: " + std::to_string(added.size()) + " new (" + list(added) +
            "), " + std::to_string(gone.size()) + " gone (" + list(gone) + ")");
  }
  report_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report_;
}

}  // namespace

std::string WorkloadReport::summary() const {
  std::ostringstream s;
  s << transfers() << " transfers under kills (" << child_transfers << " by fetching children, "
    << fetcher_kills << " of them killed; " << owner_fetches << " from owner children, "
    << owner_fetches_ok << " completed, " << owner_kills << " owners killed), " << abort_fetches
    << " fetches racing aborts/deadlines (" << aborted << " aborted, " << timed_out
    << " timed out), " << honest_fetches << " honest fetches, " << bytes_checked / 1e6
    << " MB checked, " << problems.size() << " problems";
  return s.str();
}

WorkloadReport run_fault_workload(const WorkloadOptions& options) {
  return Workload(options).run();
}

}  // namespace ferry::test
