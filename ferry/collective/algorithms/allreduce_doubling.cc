#include "ferry/collective/algorithms/allreduce_doubling.h"

#include <string>

namespace ferry::collective {

// With N = 2^k + rem, ranks 2i and 2i+1 for i < rem pair first: the even one offers its tensor
// to the odd one, which reduces the two (in rank order) and runs the doubling for both, then
// offers the result back. At step i of the doubling a rank exchanges its value with the rank
// whose number (among the 2^k) differs in bit i, and both compute lower op upper, so every rank
// computes the same expression and gets the same bits.
//
// log2(N) messages of the whole tensor per rank, where a direct exchange (every rank fetching
// every other rank's tensor) takes N-1, each a fetch request and a reply on the wire: for a
// small tensor that per-message CPU is the latency. Every fetch is posted at the start (a value
// not yet offered waits on its owner). Memory: the caller's `data` is offered at step 0 (or to
// the odd partner, folded); a folded rank's result lands in `data` only after its partner read
// it (it reduces the pair before the doubling it ends with). Each step reduces into the slot the
// partner's value landed in (reduce_to keeps lower op upper whichever rank this is), a slot no
// offer reads: no copy per step. The last step reduces straight into `data` when no offer reads
// it any more (on an odd rank of a pair none ever does; elsewhere once step 0's offer has been
// sent), else into its slot, copied into `data` after Call::finish (every offer sent).
Status allreduce_doubling(Call& call, std::span<std::byte> data, DType dtype, ReduceOp op) {
  const size_t bytes = data.size();
  const int n = call.size();
  const int rank = call.rank();
  int k = 0;
  while ((2 << k) <= n) ++k;
  const int rem = n - (1 << k);
  // The first 2 rem ranks pair up: the even one folds its tensor into the odd one and waits for
  // the result; the odd ones and the rest (numbered nr) run the doubling.
  const bool paired = rank < 2 * rem;
  const int nr = paired ? rank / 2 : rank - rem;
  const auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  // Slots of the scratch: 0, what the folded partner sends; 1 + i, the partner's value at step i,
  // then the result of step i.
  auto space = call.scratch((k + 1) * bytes);
  if (!space) return call.fail(-1, space.error(), "receive space");
  const auto slot = [&](int j) { return space->subspan(j * bytes, bytes); };
  const size_t first = call.taken();
  if (paired && rank % 2 == 0) {
    if (auto s = call.offer("fold", data, {rank + 1}); !s) return s;
    call.take(rank + 1, "unfold", data);
    return call.finish();
  }
  if (paired) call.take(rank - 1, "fold", slot(0));
  for (int i = 0; i < k; ++i) {
    call.take(real(nr ^ (1 << i)), "rd" + std::to_string(i), slot(1 + i));
  }
  std::span<std::byte> cur = data;
  size_t next_pending = first;
  if (paired) {
    if (auto s = call.wait(next_pending++); !s) return s;
    if (auto ec = reduce_into(dtype, op, slot(0), data)) return call.fail(-1, ec, "reduce");
    cur = slot(0);
  }
  for (int i = 0; i < k; ++i) {
    const int pnr = nr ^ (1 << i);
    if (auto s = call.offer("rd" + std::to_string(i), cur, {real(pnr)}); !s) return s;
    if (auto s = call.wait(next_pending++); !s) return s;
    auto theirs = slot(1 + i);
    const bool done_with_data = i == k - 1 && (paired || call.sent("rd0"));
    const auto into = done_with_data ? data : theirs;
    const auto ec = nr < pnr ? reduce_to(dtype, op, into, cur, theirs)
                             : reduce_to(dtype, op, into, theirs, cur);
    if (ec) return call.fail(-1, ec, "reduce");
    cur = into;
  }
  if (paired) {
    if (auto s = call.offer("unfold", cur, {rank - 1}); !s) return s;
  }
  call.forget(first);
  if (auto s = call.finish(); !s) return s;
  if (cur.data() != data.data()) copy_into(data, cur);
  return {};
}

}  // namespace ferry::collective
