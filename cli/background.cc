#include "cli/background.h"

#include <algorithm>
#include <utility>

namespace ferry::cli {

Background::Background(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)), worker_([this] { run(); }) {}

Background::~Background() {
  drain();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void Background::submit(Job job) {
  {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [this] { return jobs_.size() + running_ < capacity_; });
    jobs_.push_back(std::move(job));
  }
  changed_.notify_all();
}

void Background::drain() {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [this] { return jobs_.empty() && running_ == 0; });
}

void Background::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    lock.unlock();
    job();
    job = nullptr;  // what it holds (a fetched object's memory) goes before it counts as done
    lock.lock();
    --running_;
    changed_.notify_all();
  }
}

}  // namespace ferry::cli
