#include "ferry/collective/service.h"

#include <cstring>

#include "ferry/collective/call.h"
#include "ferry/net/core/deadline.h"
#include "ferry/net/errors.h"
#include "ferry/net/log.h"
#include "ferry/net/system/system_memory.h"
#include "ferry/net/system/thread_name.h"

namespace ferry::collective {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kMaxRanks = 64;

enum Kind : uint32_t { kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter, kRelease };

// A command, as the driver offers it (fixed size: the services fetch it by name before it
// exists, so they must know its size).
struct Command {
  uint32_t kind = 0;
  uint32_t dtype = 0;
  uint32_t op = 0;
  int32_t root = 0;
  uint32_t ranks = 0;
  uint32_t reserved = 0;
  uint64_t release = 0;  // kRelease: the command whose results go
  uint64_t object_ids[kMaxRanks] = {};
};

// What a rank reports when it has run a command.
struct Done {
  int32_t ok = 0;
  int32_t failed_rank = -1;
};

std::string name_of(const std::string& what, const std::string& name, uint64_t id) {
  return "ferry.collective." + what + "/" + name + "/" + std::to_string(id);
}

}  // namespace

// ---------------------------------------------------------------- the rank's side

Service::Service(Context& ctx, Group& group, std::string driver_address, std::string name)
    : ctx_(ctx), group_(group), driver_(std::move(driver_address)), name_(std::move(name)) {
  thread_ = std::thread([this] { run(); });
  name_thread(thread_, "ferry-service");
}

Service::~Service() {
  {
    std::lock_guard lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  {
    std::lock_guard lock(poll_mu_);
    if (poll_.valid()) poll_.abort();
  }
  thread_.join();
  for (const auto& [id, ref] : results_) ctx_.release(ref);
}

void Service::run() {
  Peer driver;
  uint64_t next = 1;
  std::vector<ObjectRef> marker_refs;
  while (!stop_) {
    if (!driver.valid() || !driver.is_open()) {
      auto p = ctx_.connect(driver_);
      if (!p) {  // the driver is not there (yet): again in 200 ms, or stop at once
        std::unique_lock lock(stop_mu_);
        stop_cv_.wait_for(lock, milliseconds(200), [this] { return stop_.load(); });
        continue;
      }
      driver = *p;
    }
    // Long poll: the driver holds the fetch until the command exists, for up to a second.
    auto cmd = std::make_shared<Command>();
    auto ref = ObjectRef::named(driver_, name_of("cmd", name_, next),
                                {TensorMeta::bytes(sizeof(Command))});
    auto req = driver.fetch(ref, {std::as_writable_bytes(std::span(cmd.get(), 1))},
                            {.timeout = milliseconds(1000)});
    {
      std::lock_guard lock(poll_mu_);
      poll_ = req;
    }
    if (stop_) req.abort();  // the destructor may have looked before poll_ was set
    req.wait(milliseconds(5000));
    {
      std::lock_guard lock(poll_mu_);
      poll_ = {};
    }
    if (auto outcome = req.outcome(); !outcome || *outcome) {
      if (!outcome) req.abort();
      continue;  // not submitted yet, or the driver is gone (reconnect above)
    }
    const uint64_t id = next++;
    const int n = group_.size();
    const int rank = group_.rank();
    if (cmd->kind == kRelease) {
      if (auto it = results_.find(cmd->release); it != results_.end()) {
        ctx_.release(it->second);
        results_.erase(it);
      }
      continue;
    }
    Status s;
    auto out = std::make_shared<std::vector<std::byte>>();
    ObjectStore::Pin pin;
    std::span<const std::byte> in;
    const bool needs_input = cmd->kind != kBroadcast || cmd->root == rank;
    bool left_out = false;  // a failure of this rank alone kept it out of the Group call
    if (cmd->ranks != static_cast<uint32_t>(n)) {
      s = {errc::invalid_argument, rank, "command for " + std::to_string(cmd->ranks) + " ranks"};
    } else if (needs_input) {
      pin = ctx_.store().pin(cmd->object_ids[rank]);
      if (!pin || pin.object().tensors.size() != 1) {
        left_out = true;
        s = {errc::object_not_found, rank,
             "no one-tensor object " + std::to_string(cmd->object_ids[rank]) + " here"};
      } else {
        in = pin.object().tensors[0].data;
      }
    }
    const auto dtype = static_cast<DType>(cmd->dtype);
    const auto op = static_cast<ReduceOp>(cmd->op);
    if (s.ok()) {
      try {
        switch (cmd->kind) {
          case kAllreduce:
            out->assign(in.begin(), in.end());
            s = group_.allreduce(*out, dtype, op);
            break;
          case kBroadcast: {
            // Every rank learns the size from the root's object through the command's object id
            // only on the root; the others take it from the root's broadcast of its size first.
            uint64_t size = in.size();
            s = group_.broadcast(std::as_writable_bytes(std::span(&size, 1)), cmd->root);
            if (!s.ok()) break;
            if (size > physical_memory_bytes()) {
              left_out = true;
              s = {errc::resource_exhausted, rank,
                   "the root broadcasts " + std::to_string(size) +
                       " bytes, more than this machine's memory"};
              break;
            }
            out->resize(size);
            if (rank == cmd->root && !in.empty()) std::memcpy(out->data(), in.data(), in.size());
            s = group_.broadcast(*out, cmd->root);
            break;
          }
          case kAllgather:
            out->resize(in.size() * static_cast<size_t>(n));
            s = group_.allgather(in, *out);
            break;
          case kReduceScatter: {
            const size_t esize = dtype_size(dtype);
            const size_t count = esize ? in.size() / esize : 0;
            auto [first, last] = Group::chunk_range(count, rank, n);
            out->resize((last - first) * esize);
            s = group_.reduce_scatter(in, *out, dtype, op);
            break;
          }
          default:
            s = {errc::invalid_argument, rank, "unknown command"};
        }
      } catch (const std::bad_alloc&) {
        left_out = true;  // abandon() is a no-op if a call of the command failed the Group
        s = {errc::resource_exhausted, rank, "out of memory for the result"};
      }
    }
    if (left_out) {
      // This rank could not make the command's Group call (its input is missing here, it ran
      // out of memory, the root's size does not fit here) while the others did: it fails the
      // Group for all, or their call would pair with this rank's next command (the calls of a
      // Group are matched by their number). They fail at once, naming this rank; the driver
      // hears the command's own reason. A refusal every rank makes alike (a command for another
      // number of ranks, an unknown kind) leaves the Group as it is.
      group_.abandon("command " + std::to_string(id), s.ec, s.message);
    }
    pin = {};
    auto done = std::make_shared<Done>();
    if (s.ok()) {
      PutOptions o;
      o.name = name_of("result", name_, id);
      auto put = ctx_.put({Tensor::bytes(*out)}, out, o);
      if (put) {
        results_[id] = *put;
      } else {
        s = {put.error(), rank, "cannot store the result"};
      }
    }
    if (!s.ok()) FERRY_LOG_WARN("collective service '{}': command {}: {}", name_, id, s.message);
    done->ok = s.ok();
    done->failed_rank = s.ok() ? -1 : (s.rank >= 0 ? s.rank : rank);
    PutOptions o;
    o.name = name_of("done", name_, id) + "/" + std::to_string(rank);
    auto marker = ctx_.put({Tensor::bytes(std::as_bytes(std::span(done.get(), 1)))}, done, o);
    // Kept until the service ends: the driver may ask for it any time before then.
    if (marker) marker_refs.push_back(*marker);
  }
  for (const auto& ref : marker_refs) ctx_.release(ref);
}

// ---------------------------------------------------------------- the driver's side

Driver::Driver(Context& ctx, std::vector<std::string> ranks, std::string name,
               std::chrono::milliseconds timeout)
    : ctx_(ctx),
      ranks_(std::move(ranks)),
      name_(std::move(name)),
      timeout_(bounded_timeout(timeout)),
      commands_(std::make_shared<Commands>()) {
  commands_->ctx = &ctx_;
}

Driver::~Driver() {
  std::lock_guard lock(commands_->mu);
  for (const auto& [id, ref] : commands_->offered) ctx_.release(ref);
  commands_->offered.clear();
  commands_->ctx = nullptr;
}

void Driver::Commands::release_through(uint64_t id) {
  std::lock_guard lock(mu);
  if (!ctx) return;
  for (auto it = offered.begin(); it != offered.end() && it->first <= id;) {
    ctx->release(it->second);
    it = offered.erase(it);
  }
}

Result<std::unique_ptr<Driver>> Driver::create(Context& ctx, std::vector<std::string> ranks,
                                               std::string name,
                                               std::chrono::milliseconds timeout) {
  if (ranks.empty() || ranks.size() > kMaxRanks) return errc::invalid_argument;
  std::unique_ptr<Driver> d(new Driver(ctx, std::move(ranks), std::move(name), timeout));
  const auto deadline = std::chrono::steady_clock::now() + d->timeout_;
  for (const auto& address : d->ranks_) {
    for (;;) {
      auto p = ctx.connect(address);
      if (p) {
        d->peers_.push_back(*p);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        FERRY_LOG_WARN("collective driver: cannot reach rank at {}", address);
        return p.error();
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  return d;
}

namespace {

// A submission that failed before anything was sent: `done` holds `why` already.
Submitted refused(Status why) {
  std::promise<Status> failed;
  failed.set_value(std::move(why));
  Submitted s;
  s.done = failed.get_future().share();
  return s;
}

}  // namespace

Status Driver::check(const std::vector<ObjectRef>& refs, int root) const {
  if (refs.size() != ranks_.size()) {
    return {errc::invalid_argument, -1,
            std::to_string(refs.size()) + " refs for " + std::to_string(ranks_.size()) +
                " ranks: one per rank, in rank order"};
  }
  if (root < 0 || static_cast<size_t>(root) >= ranks_.size()) {
    return {errc::invalid_argument, -1,
            "root " + std::to_string(root) + " is not a rank (0 to " +
                std::to_string(ranks_.size() - 1) + ")"};
  }
  return {};
}

Submitted Driver::submit(int kind, const std::vector<ObjectRef>& refs, DType dtype, ReduceOp op,
                         int root, std::vector<size_t> result_sizes) {
  const uint64_t id = ++next_;
  auto cmd = std::make_shared<Command>();
  cmd->kind = static_cast<uint32_t>(kind);
  cmd->dtype = static_cast<uint32_t>(dtype);
  cmd->op = static_cast<uint32_t>(op);
  cmd->root = root;
  cmd->ranks = static_cast<uint32_t>(ranks_.size());
  for (size_t r = 0; r < refs.size() && r < kMaxRanks; ++r) cmd->object_ids[r] = refs[r].object_id;
  PutOptions o;
  o.name = name_of("cmd", name_, id);
  auto put = ctx_.put({Tensor::bytes(std::as_bytes(std::span(cmd.get(), 1)))}, cmd, o);
  if (!put) {
    auto s = refused({put.error(), -1, "cannot offer the command"});
    s.id = id;
    return s;
  }
  Submitted s;
  s.id = id;
  {
    std::lock_guard lock(commands_->mu);
    commands_->offered.emplace(id, *put);
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    s.results.push_back(ObjectRef::named(ranks_[r], name_of("result", name_, id),
                                         {TensorMeta::bytes(result_sizes[r])}));
  }
  // Every rank's done marker, fetched (waiting on each rank) within the timeout.
  s.done =
      std::async(
          std::launch::async,
          [peers = peers_, ranks = ranks_, name = name_, id, timeout = timeout_,
           commands = commands_]() mutable -> Status {
            std::vector<Done> done(peers.size());
            std::vector<FetchRequest> reqs;
            // Whatever this returns with, no fetch writes into `done` after it: those still
            // pending end first (aborted, each bounded by its own timeout as well).
            struct EndAll {
              std::vector<FetchRequest>& reqs;
              milliseconds bound;
              ~EndAll() {
                for (auto& q : reqs) q.abort();
                for (auto& q : reqs) q.wait(bound);
              }
            } end_all{reqs, timeout + milliseconds(1000)};
            for (size_t r = 0; r < peers.size(); ++r) {
              auto ref =
                  ObjectRef::named(ranks[r], name_of("done", name, id) + "/" + std::to_string(r),
                                   {TensorMeta::bytes(sizeof(Done))});
              reqs.push_back(peers[r].fetch(ref, {std::as_writable_bytes(std::span(&done[r], 1))},
                                            {.timeout = timeout}));
            }
            for (size_t r = 0; r < reqs.size(); ++r) {
              auto ec = reqs[r].wait(timeout + milliseconds(1000));
              if (ec) {
                return {ec, static_cast<int>(r),
                        "rank " + std::to_string(r) + " (" + ranks[r] +
                            ") did not report: " + ec.message()};
              }
              if (!done[r].ok) {
                return {errc::aborted, done[r].failed_rank,
                        "rank " + std::to_string(r) + " reports the collective failed on rank " +
                            std::to_string(done[r].failed_rank)};
              }
            }
            commands->release_through(id);  // every rank has fetched every command up to it
            return {};
          })
          .share();
  return s;
}

Status Driver::check_reducible(const std::vector<ObjectRef>& refs, DType dtype) const {
  const size_t esize = dtype_size(dtype);
  if (esize == 0 || dtype == DType::kBool) {
    return {errc::invalid_argument, -1, "the dtype is not one the reductions cover"};
  }
  for (size_t r = 0; r < refs.size(); ++r) {
    if (refs[r].metadata.total_bytes() % esize) {
      return {errc::invalid_argument, static_cast<int>(r),
              "rank " + std::to_string(r) + "'s object is not whole elements of the dtype"};
    }
  }
  return {};
}

Submitted Driver::allreduce(const std::vector<ObjectRef>& refs, DType dtype, ReduceOp op) {
  if (auto why = check(refs, 0); !why) return refused(why);
  if (auto why = check_reducible(refs, dtype); !why) return refused(why);
  std::vector<size_t> sizes;
  for (const auto& ref : refs) sizes.push_back(ref.metadata.total_bytes());
  return submit(kAllreduce, refs, dtype, op, 0, sizes);
}

Submitted Driver::broadcast(const std::vector<ObjectRef>& refs, int root) {
  if (auto why = check(refs, root); !why) return refused(why);
  const size_t size = refs.at(static_cast<size_t>(root)).metadata.total_bytes();
  return submit(kBroadcast, refs, DType::kUInt8, ReduceOp::kSum, root,
                std::vector<size_t>(ranks_.size(), size));
}

Submitted Driver::allgather(const std::vector<ObjectRef>& refs) {
  if (auto why = check(refs, 0); !why) return refused(why);
  size_t size = refs.empty() ? 0 : refs[0].metadata.total_bytes();
  return submit(kAllgather, refs, DType::kUInt8, ReduceOp::kSum, 0,
                std::vector<size_t>(ranks_.size(), size * ranks_.size()));
}

Submitted Driver::reduce_scatter(const std::vector<ObjectRef>& refs, DType dtype, ReduceOp op) {
  if (auto why = check(refs, 0); !why) return refused(why);
  if (auto why = check_reducible(refs, dtype); !why) return refused(why);
  const size_t esize = dtype_size(dtype);
  const size_t count = refs.empty() || !esize ? 0 : refs[0].metadata.total_bytes() / esize;
  std::vector<size_t> sizes;
  const int n = static_cast<int>(ranks_.size());
  for (int r = 0; r < n; ++r) {
    auto [first, last] = Group::chunk_range(count, r, n);
    sizes.push_back((last - first) * esize);
  }
  return submit(kReduceScatter, refs, dtype, op, 0, sizes);
}

void Driver::release(const Submitted& s) {
  const uint64_t id = ++next_;
  auto cmd = std::make_shared<Command>();
  cmd->kind = kRelease;
  cmd->ranks = static_cast<uint32_t>(ranks_.size());
  cmd->release = s.id;
  PutOptions o;
  o.name = name_of("cmd", name_, id);
  if (auto put = ctx_.put({Tensor::bytes(std::as_bytes(std::span(cmd.get(), 1)))}, cmd, o)) {
    std::lock_guard lock(commands_->mu);
    commands_->offered.emplace(id, *put);
  }
}

}  // namespace ferry::collective
