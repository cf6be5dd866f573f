// Fails one chosen allocation of this thread with std::bad_alloc: for tests that walk every
// allocation an operation makes and check that it completes, exactly once, whichever one fails.
// The test binary that links failing_allocation.cc has operator new and delete replaced by
// malloc and free, counted per thread; nothing fails unless a FailingAllocation is alive.
#pragma once

#include <cstddef>

namespace ferry::test {

// While alive, the allocation number `n` (0: the next) made with operator new on the thread
// that made it fails, once; the others go through. Not nestable.
class FailingAllocation {
 public:
  explicit FailingAllocation(size_t n);
  ~FailingAllocation();
  FailingAllocation(const FailingAllocation&) = delete;
  FailingAllocation& operator=(const FailingAllocation&) = delete;

  // Whether the chosen allocation was reached (and failed): when not, the operation under test
  // made fewer allocations than `n`, and counting further finds nothing new.
  bool fired() const;
  // Allocations let through so far.
  size_t passed() const;
};

}  // namespace ferry::test
