#include "cli/serve.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <tuple>

#include "cli/checksum.h"
#include "cli/manifest.h"
#include "cli/metrics.h"
#include "cli/status.h"
#include "cli/units.h"
#include "cli/workload.h"
#include "ferry/ferry.h"
#include "ferry/net/system/system_memory.h"

namespace ferry::cli {
namespace {

// One object's memory: every tensor in a single allocation.
struct Blob {
  std::shared_ptr<std::byte[]> memory;
  std::vector<std::span<const std::byte>> tensors;
  std::string name;  // a served file's name; "" for random objects
};

Blob make_random_object(const std::vector<uint64_t>& sizes, uint64_t seed) {
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  Blob blob{std::make_shared_for_overwrite<std::byte[]>(total ? total : 1), {}};
  std::byte* p = blob.memory.get();
  for (size_t i = 0; i < sizes.size(); p += sizes[i], ++i) {
    fill_random({p, sizes[i]}, derive_seed(seed, i));
    blob.tensors.emplace_back(p, sizes[i]);
  }
  return blob;
}

// Reads a whole file into one tensor; sets `error` on failure.
bool read_file(const std::string& path, Blob& blob, std::string& error) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    error = std::strerror(errno);
    return false;
  }
  const auto size = static_cast<size_t>(in.tellg());
  blob.memory = std::make_shared_for_overwrite<std::byte[]>(size ? size : 1);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(blob.memory.get()), static_cast<std::streamsize>(size))) {
    error = "read failed";
    return false;
  }
  blob.tensors = {{blob.memory.get(), size}};
  blob.name = std::filesystem::path(path).filename().string();
  return true;
}

// Blocks until SIGINT or SIGTERM (already blocked in every thread) or until `duration` seconds
// pass (0 = no limit). Returns the signal, or 0 when the duration ran out.
int wait_for_stop(const sigset_t& signals, double duration) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(duration));
  for (;;) {
    int sig;
    if (duration <= 0) {
      sig = sigwaitinfo(&signals, nullptr);
    } else {
      const auto left = std::max(deadline - Clock::now(), Clock::duration::zero());
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      sig = sigtimedwait(&signals, nullptr, &ts);
    }
    if (sig > 0) return sig;
    if (errno == EAGAIN) return 0;
  }
}

void print_objects(const Manifest& manifest, bool json) {
  if (json) {
    std::fputs(manifest_to_json(manifest).c_str(), stdout);
    return;
  }
  for (const auto& object : manifest.objects) {
    std::string sums;
    for (const auto& t : object.tensors) {
      if (!sums.empty()) sums += ',';
      sums += checksum_hex(t.checksum);
    }
    std::printf("%s %llu %s\n", object.ref.c_str(), static_cast<unsigned long long>(object.bytes),
                sums.c_str());
  }
}

// Puts every blob into the context's store (its memory kept alive by the store) and records its
// ref, sizes and checksums in `manifest`.
std::error_code put_objects(Context& ctx, std::vector<Blob>& blobs, Manifest& manifest) {
  for (auto& blob : blobs) {
    std::vector<Tensor> tensors;
    ManifestObject entry;
    for (auto t : blob.tensors) {
      tensors.push_back(Tensor::bytes(t));
      entry.tensors.push_back({t.size(), checksum(t)});
      entry.bytes += t.size();
    }
    auto ref = ctx.put(std::move(tensors), std::move(blob.memory));
    if (!ref) return ref.error();
    entry.ref = ref->to_string();
    entry.name = blob.name;
    manifest.objects.push_back(std::move(entry));
  }
  blobs.clear();
  return {};
}

}  // namespace

namespace {

// run_serve but for the failure document --json prints.
int serve(const ServeArgs& args, ContextOptions options) {
  // Block the stop signals before the Context starts its threads, so they inherit the mask and
  // this thread alone receives them through sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::vector<Blob> blobs;
  for (const auto& path : args.files) {
    std::string error;
    if (!read_file(path, blobs.emplace_back(), error)) {
      return fail(kExitUsage, "read " + path + ": " + error);
    }
  }
  WorkloadSpec spec;
  spec.objects = args.objects;
  std::tie(spec.min_tensors, spec.max_tensors) = *parse_range(args.tensors, parse_count);
  std::tie(spec.min_bytes, spec.max_bytes) = *parse_range(args.sizes, parse_size);
  spec.total_bytes = args.total.empty() ? 0 : *parse_size(args.total);
  spec.seed = args.seed;
  if (spec.objects * spec.max_tensors > kMaxPlannedTensors) {
    return fail(kExitUsage, "--objects x --tensors: at most " + std::to_string(kMaxPlannedTensors) +
                                " tensors in all");
  }
  const auto plan = plan_workload(spec);
  // Every byte is made and held at once: refuse what this machine cannot hold, before trying.
  uint64_t planned = 0;
  for (const auto& sizes : plan) {
    for (uint64_t s : sizes) planned = planned + s < planned ? ~uint64_t{0} : planned + s;
  }
  if (planned > physical_memory_bytes()) {
    return fail(kExitUsage, "--objects, --tensors, --sizes and --total ask for " +
                                format_bytes(planned) + " of random objects; this machine has " +
                                format_bytes(physical_memory_bytes()) + " of memory");
  }
  try {
    for (size_t i = 0; i < plan.size(); ++i) {
      blobs.push_back(make_random_object(plan[i], derive_seed(args.seed, i)));
    }
  } catch (const std::bad_alloc&) {
    return fail(kExitUsage, "out of memory making " + format_bytes(planned) + " of random objects");
  }

  options.name = "ferry-serve";
  options.threads = args.threads;
  auto ctx = Context::create(options);
  if (!ctx) return fail(kExitUsage, "create context", ctx.error());
  // Listen first: refs name the listener's address as their owner.
  auto port = (*ctx)->listen(args.listen);
  if (port.error() == errc::invalid_argument) {
    return fail(kExitUsage, "listen on " + args.listen + ": expected IP:PORT (a numeric address)");
  }
  if (!port) return fail(kExitConnect, "listen on " + args.listen, port.error());

  Manifest manifest;
  manifest.server = (*ctx)->address();
  if (auto ec = put_objects(**ctx, blobs, manifest)) return fail(kExitUsage, "put object", ec);
  if (!args.manifest.empty()) {
    std::string error;
    if (!write_manifest(args.manifest, manifest, error)) {
      return fail(kExitUsage, "write manifest " + args.manifest + ": " + error);
    }
  }
  MetricsServer metrics;
  if (!args.metrics.empty()) {
    std::string bound;
    auto render = [c = ctx->get()] { return prometheus_text(c->stats()); };
    if (auto ec = metrics.start(args.metrics, std::move(render), bound)) {
      return fail(
          ec == errc::invalid_argument ? kExitUsage : kExitConnect,
          "--metrics " + args.metrics + (ec == errc::invalid_argument ? ": expected IP:PORT" : ""),
          ec);
    }
    std::fprintf(stderr, "metrics http://%s/metrics\n", bound.c_str());
  }
  print_objects(manifest, args.json);
  // With --json stdout is the one JSON document (it appears once serving has begun); the ready
  // line goes to stderr.
  std::fprintf(args.json ? stderr : stdout, "ready %s\n", manifest.server.c_str());
  std::fflush(stdout);

  const int sig = wait_for_stop(signals, args.duration);
  std::fprintf(stderr, "ferry serve: %s; stopping\n", sig ? strsignal(sig) : "duration elapsed");
  (*ctx)->close();
  return kExitOk;
}

}  // namespace

int run_serve(const ServeArgs& args, ContextOptions options) {
  const int rc = serve(args, std::move(options));
  if (rc != kExitOk && args.json) std::fputs(failure_json().c_str(), stdout);
  return rc;
}

}  // namespace ferry::cli
