#include "tests/failing_allocation.h"

#include <algorithm>
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

void* memalign(size_t n, std::align_val_t align) noexcept {
  const size_t a = std::max(static_cast<size_t>(align), sizeof(void*));
  void* p = nullptr;
  return posix_memalign(&p, a, n ? n : 1) == 0 ? p : nullptr;
}

void* allocate_aligned(size_t n, std::align_val_t align, const std::nothrow_t&) noexcept {
  if (fails_now()) return nullptr;
  return memalign(n, align);
}

void* allocate_aligned(size_t n, std::align_val_t align) {
  if (fails_now()) throw std::bad_alloc();
  if (void* p = memalign(n, align)) return p;
  throw std::bad_alloc();
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

// Every replaceable form, on malloc / posix_memalign and free (so that each delete pairs with
// its new under a sanitizer's allocator too). Asio allocates its queued operations aligned.
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
void* operator new(size_t n, std::align_val_t a) { return ferry::test::allocate_aligned(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return ferry::test::allocate_aligned(n, a); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return ferry::test::allocate_aligned(n, a, t);
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return ferry::test::allocate_aligned(n, a, t);
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
