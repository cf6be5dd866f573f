// Fails one chosen allocation of this thread with std::bad_alloc: for tests that walk every
// allocation an operation makes and check that it completes, exactly once, whichever one fails.
// The test binary that links failing_allocation.cc has operator new and delete replaced by
// malloc and free, counted per thread; nothing fails unless a FailingAllocation is alive.
#pragma once

#include <cstddef>
#include <new>

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

// One step of an allocation walk: runs `step()` with the allocation `left` of it failing, and
// `recover()` (what the step's caller does then: fail the operation, end the session) when it
// throws std::bad_alloc. Returns whether the allocation failed; if not, takes what the step
// allocated off `left`, for the next step to count on from there.
template <typename Step, typename Recover>
bool fails_within(size_t& left, Step&& step, Recover&& recover) {
  FailingAllocation fail(left);
  try {
    step();
  } catch (const std::bad_alloc&) {
    recover();
  }
  left -= fail.passed();
  return fail.fired();
}

}  // namespace ferry::test
