// ChildProcess: a ferry_test_server child (serving, or fetching) for multi-process tests, with
// its stdout on a pipe read line by line under deadlines. Killed with SIGKILL and reaped on
// destruction; nothing here waits without a deadline.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ferry::test {

class ChildProcess {
 public:
  // Runs FERRY_TEST_SERVER with `args` (under `wrapper`, e.g. {"ip", "netns", "exec", "ns"},
  // when given) and reads its output until `ready_line` (20 s at most, scaled), collecting
  // "listening PORT" and "ref REF" lines on the way.
  explicit ChildProcess(const std::vector<std::string>& args,
                        const std::string& ready_line = "ready",
                        const std::vector<std::string>& wrapper = {}) {
    // Everything the child needs is built before fork: the parent has threads, and one of them
    // may hold the allocator's lock at the fork, so the child must not allocate before exec
    // (ASan's allocator, unlike glibc's, can then hang it for good).
    std::vector<char*> argv;
    for (const auto& s : wrapper) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(const_cast<char*>(FERRY_TEST_SERVER));
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
    for (std::string line; read_line(line, scaled(std::chrono::seconds(20)));) {
      if (line.rfind("listening ", 0) == 0) {
        port = line.substr(10);
        address = test_host() + ":" + port;
      }
      if (line.rfind("ref ", 0) == 0) refs.push_back(*ObjectRef::from_string(line.substr(4)));
      if (line == ready_line) {
        ready = true;
        break;
      }
    }
    EXPECT_TRUE(ready) << "test child did not say '" << ready_line << "'";
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    kill(SIGKILL);
    if (out_ >= 0) ::close(out_);
  }

  // Sends `sig`; SIGKILL also reaps the child; SIGSTOP returns once the child has stopped (a
  // signal is delivered asynchronously: a child still running for a moment could serve a
  // request sent right after kill()), or fails the test after 5 s (scaled).
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGKILL) {
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    } else if (sig == SIGSTOP) {
      wait_stopped(std::chrono::seconds(5));
    }
  }
  bool alive() const { return pid_ > 0; }

  // One line of output, waiting at most `timeout` for it; false on timeout or end of output.
  bool read_line(std::string& line, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = pending_.find('\n'); nl != std::string::npos) {
        line = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        return true;
      }
      // Rounded up, and at least one poll: a short timeout still reads what is there.
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) <= 0) return false;
      char buf[4096];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) return false;
      pending_.append(buf, static_cast<size_t>(n));
    }
  }

  std::string address;  // test_host():PORT
  std::string port;
  std::vector<ObjectRef> refs;
  bool ready = false;

 private:
  void wait_stopped(std::chrono::milliseconds timeout) {
    int status = 0;
    pid_t r = 0;
    if (!eventually([&] { return (r = ::waitpid(pid_, &status, WNOHANG | WUNTRACED)) != 0; },
                    timeout) ||
        r < 0) {
      ADD_FAILURE() << "test child did not stop within " << timeout.count() << " ms";
    } else if (!WIFSTOPPED(status)) {
      pid_ = -1;  // it ended instead, and is reaped
      ADD_FAILURE() << "test child ended instead of stopping";
    }
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string pending_;
};

inline size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

}  // namespace ferry::test
