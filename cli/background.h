// One worker thread that runs jobs in order, with a bound on how many wait: `ferry fetch`
// verifies and writes each object there while its main thread keeps the window of fetches full.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ferry::cli {

class Background {
 public:
  using Job = std::function<void()>;

  // Starts the worker. `capacity` (at least 1): jobs queued or running at a time.
  explicit Background(size_t capacity);
  // drain(), then ends the worker.
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  // Queues `job`, first waiting while `capacity` jobs are queued or running (a job runs to its
  // end: the wait is as long as the jobs are). A job must not throw; one that does ends the
  // process. Any thread but the worker.
  void submit(Job job);
  // Returns once every job submitted so far has run. Any thread but the worker.
  void drain();

 private:
  void run();

  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  size_t running_ = 0;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

}  // namespace ferry::cli
