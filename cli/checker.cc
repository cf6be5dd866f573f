#include "cli/checker.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "cli/checksum.h"
#include "ferry/net/system/cpus.h"

namespace ferry::cli {
namespace {

// A name the manifest gives that is safe as one file name in the --out folder (no separator,
// not "." or ".."), or "".
std::string safe_name(const ManifestObject* expected) {
  if (!expected) return "";
  const auto& n = expected->name;
  if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos ||
      n.find('\0') != std::string::npos) {
    return "";
  }
  return n;
}

}  // namespace

std::string mismatch(const FetchResult& r, const ManifestObject& expected) {
  if (r.tensors.size() != expected.tensors.size()) {
    return std::to_string(r.tensors.size()) + " tensors received, the manifest lists " +
           std::to_string(expected.tensors.size());
  }
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& want = expected.tensors[i];
    const std::string which = "tensor " + std::to_string(i) + ": ";
    if (r.tensors[i].size() != want.bytes) {
      return which + std::to_string(r.tensors[i].size()) + " bytes received, the manifest says " +
             std::to_string(want.bytes);
    }
    if (const uint64_t got = checksum(r.tensors[i]); got != want.checksum) {
      return which + "checksum " + checksum_hex(got) + " differs from the manifest's " +
             checksum_hex(want.checksum);
    }
  }
  return "";
}

std::string write_tensors(const std::filesystem::path& dir, const FetchResult& r,
                          const std::string& name) {
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const auto file = name.empty() ? "object-" + std::to_string(r.ref.object_id) + "." +
                                         std::to_string(i) + ".bin"
                      : r.tensors.size() == 1 ? name
                                              : name + "." + std::to_string(i);
    const auto path = dir / file;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    bool ok =
        f && std::fwrite(r.tensors[i].data(), 1, r.tensors[i].size(), f) == r.tensors[i].size();
    if (f && std::fclose(f) != 0) ok = false;
    if (!ok) return "write " + path.string() + ": " + std::strerror(errno);
  }
  return "";
}

Checker::Checker(unsigned threads, std::filesystem::path out)
    : out_(std::move(out)), pool_(std::max(threads, 1u)) {}

Checker::~Checker() { pool_.join(); }

void Checker::submit(FetchResult result, const ManifestObject* expected,
                     std::function<void(Checked)> done) {
  // The job owns the result: its memory is let go on the worker once the object is checked.
  auto job = std::make_shared<FetchResult>(std::move(result));
  boost::asio::post(pool_, [this, job, expected, done = std::move(done)]() mutable {
    Checked c;
    if (expected) c.mismatch = mismatch(*job, *expected);
    if (!out_.empty()) c.write_error = write_tensors(out_, *job, safe_name(expected));
    job.reset();
    done(std::move(c));
  });
}

unsigned Checker::default_threads() { return std::clamp(usable_cores() / 4, 1u, 4u); }

}  // namespace ferry::cli
