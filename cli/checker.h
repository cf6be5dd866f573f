// Checker: verifies fetched objects against their manifest entries and writes them out (--out)
// on worker threads, so that `ferry fetch` keeps issuing fetches while objects are checked. One
// thread hashes (XXH3) about as fast as loopback TCP delivers: checked in turn on the fetching
// thread, the checks held every new fetch back behind them.
//
// Thread model: submit() from one thread (the fetch loop); the jobs run on the Checker's threads
// and report through the callback given to submit(), on one of them.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <functional>
#include <string>

#include "cli/manifest.h"
#include "ferry/ferry.h"

namespace ferry::cli {

// What checking one object found: "" in each field when all is well.
struct Checked {
  std::string mismatch;     // how the bytes differ from the manifest entry
  std::string write_error;  // what failed writing the tensors to --out
};

// Compares the received tensors with the manifest entry; "" when every byte matches.
std::string mismatch(const FetchResult& r, const ManifestObject& expected);

// Writes the object's tensors into `dir`: a file the manifest names keeps its name (tensor i of
// a multi-tensor object gets ".<i>" after it); others are object-<id>.<i>.bin. "" on success,
// else what failed.
std::string write_tensors(const std::filesystem::path& dir, const FetchResult& r,
                          const std::string& name);

class Checker {
 public:
  // `threads` workers (at least 1); `out`: the folder to write objects into, "" for none.
  Checker(unsigned threads, std::filesystem::path out);
  // Runs the jobs submitted and not yet run, then joins the workers.
  ~Checker();
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;

  // Checks `result` against `expected` (when not null, which must outlive the job) and writes it
  // out, then calls `done` with what it found and drops `result` (its memory goes back to the
  // receive pool). Never blocks.
  void submit(FetchResult result, const ManifestObject* expected,
              std::function<void(Checked)> done);

  // Workers for `ferry fetch`: a quarter of the cores this process may run on, 1 to 4.
  static unsigned default_threads();

 private:
  std::filesystem::path out_;
  boost::asio::thread_pool pool_;
};

}  // namespace ferry::cli
