// mpi-allreduce: MPI_Allreduce (MPI_FLOAT, MPI_SUM, in place) under Open MPI, the peer of
// `ferry-bench allreduce` (same loop: bench/allreduce_loop.h, same sizes, repetitions and JSON
// lines, "tool": "mpi").
//
// run.py starts it as
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 --mca pml ob1
//          --mca btl tcp,self --mca btl_tcp_if_include lo mpi-allreduce --sizes ...
// so that it moves its bytes over loopback TCP like ferry and Gloo: the shared-memory BTL (vader)
// and UCX are left out on purpose (with them MPI would not be measured on the same transport).
// Open MPI picks the allreduce algorithm by size (its "tuned" collective component). The barrier
// before each timed sample is MPI_Barrier. MPI calls have no timeout of their own: run.py bounds
// the whole mpirun.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "bench/allreduce_loop.h"
#include "bench/measure.h"

int main(int argc, char** argv) {
  using namespace ferry::bench;
  MPI_Init(&argc, &argv);
  CLI::App app{"mpi-allreduce: MPI_Allreduce beside `ferry-bench allreduce` (run under mpirun)"};
  AllreduceLoopArgs loop;
  loop.tool = "mpi";
  std::string sizes = "4K,16K,64K,256K,1M,4M,16M,64M";
  app.add_option("--sizes", sizes, "Bytes per allreduce (float32)")->capture_default_str();
  app.add_option("--reps", loop.reps, "Timed samples per size")->capture_default_str();
  app.add_option("--calls", loop.calls, "Back-to-back calls per sample")->capture_default_str();
  app.add_option("--warmup", loop.warmup, "Untimed calls per size first")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  loop.sizes = parse_size_list(sizes);
  MPI_Comm_rank(MPI_COMM_WORLD, &loop.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &loop.ranks);

  AllreduceOps ops;
  ops.allreduce = [](std::span<float> data) -> std::string {
    const int rc = MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()),
                                 MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? std::string() : "MPI_Allreduce returned " + std::to_string(rc);
  };
  ops.barrier = []() -> std::string {
    const int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? std::string() : "MPI_Barrier returned " + std::to_string(rc);
  };
  const int rc = run_allreduce_loop(loop, ops);
  if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);  // the other ranks may be waiting in a call
  MPI_Finalize();
  return rc;
}
