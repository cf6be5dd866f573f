#include "tests/failing_allocation.h"

#include <cstdlib>
#include <new>

namespace ferry::test {
namespace {

// Per thread: whether a FailingAllocation is alive, how many allocations it lets through before
// the one that fails, and whether that one came.
thread_local bool armed = false;
thread_local size_t left = 0;
thread_local size_t through = 0;
thread_local bool fired_here = false;

// Whether this allocation is the chosen one (which disarms: only one fails).
bool fails_now() noexcept {
  if (!armed) return false;
  if (left > 0) {
    --left;
    ++through;
    return false;
  }
  armed = false;
  fired_here = true;
  return true;
}

void* allocate(size_t n) {
  if (fails_now()) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* allocate(size_t n, const std::nothrow_t&) noexcept {
  if (fails_now()) return nullptr;
  return std::malloc(n ? n : 1);
}

}  // namespace

FailingAllocation::FailingAllocation(size_t n) {
  left = n;
  through = 0;
  fired_here = false;
  armed = true;
}

FailingAllocation::~FailingAllocation() { armed = false; }

bool FailingAllocation::fired() const { return fired_here; }

size_t FailingAllocation::passed() const { return through; }

}  // namespace ferry::test

// The replaceable forms that take no alignment, all on malloc and free (so that each delete
// pairs with its new under a sanitizer's allocator too); the aligned ones stay the library's.
void* operator new(size_t n) { return ferry::test::allocate(n); }
void* operator new[](size_t n) { return ferry::test::allocate(n); }
void* operator new(size_t n, const std::nothrow_t& t) noexcept {
  return ferry::test::allocate(n, t);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept {
  return ferry::test::allocate(n, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
