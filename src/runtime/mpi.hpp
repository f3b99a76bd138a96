// The MPI runtime: one RAII session, communicators and the handful of collectives fastudy uses.
//
// Every raw MPI call of the project is made in mpi.cpp, exactly once, and a failure becomes an
// MpiError that names the call, the world rank and file:line. Communicators return errors
// (MPI_ERRORS_RETURN) instead of aborting, so the error reaches main(), which prints it and then calls
// abort() to take the whole job down. A program started without mpirun runs as a single rank (Open MPI
// singleton init).
//
// Usage:
//   fastudy::mpi::MpiSession session(&argc, &argv);          // MPI_THREAD_MULTIPLE requested
//   fastudy::mpi::Comm world = fastudy::mpi::Comm::world();
//   fastudy::mpi::Comm group = world.split(world.rank() / 2, world.rank());
//   group.allreduce_sum(grad.data(), grad.size());
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <mpi.h>

#include "base/error.hpp"

namespace fastudy::mpi {

// A failed MPI call: "MPI_Allreduce failed on rank 3 (src/runtime/mpi.cpp:120): <MPI's message>".
class MpiError : public Error {
 public:
  MpiError(std::string call, int rank, int code, const char* file, int line);
  const std::string& call() const { return call_; }
  int rank() const { return rank_; }
  int code() const { return code_; }

 private:
  std::string call_;
  int rank_;
  int code_;
};

enum class ThreadLevel { single, funneled, serialized, multiple };
std::string_view to_string(ThreadLevel t);

// Initialises MPI (MPI_Init_thread) for the lifetime of the object and finalises it on destruction,
// unless MPI was already initialised by someone else (then it does neither). Before initialising it
// sets OMPI_MCA_mpi_yield_when_idle=1 unless the environment sets it: waiting ranks then yield the
// core instead of spinning, which halves collective I/O times on loaded or oversubscribed nodes
// (bench/runner). It disables Open MPI's `sharedfp/sm` component (OMPI_MCA_sharedfp=^sm unless set),
// which HDF5 never needs and which fails on busy hosts. Started without mpirun it also sets OMPI_MCA_ess_singleton_isolated=1 (unless set):
// the single rank runs without Open MPI's helper daemon. Throws MpiError when the
// library provides less than `required` (the scheduler's coordinator thread needs `multiple` once
// there is more than one rank group; a single group runs without it).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, ThreadLevel requested = ThreadLevel::multiple,
             ThreadLevel required = ThreadLevel::funneled);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  ThreadLevel provided() const { return provided_; }
  // Whether this process was launched by mpirun/srun (false for a singleton run).
  bool launched_by_mpirun() const;

  static bool initialized();
  static ThreadLevel provided_level();  // MPI_Query_thread; single when MPI is not initialised

 private:
  bool owns_ = false;
  ThreadLevel provided_ = ThreadLevel::single;
};

// A point-to-point message as received: the sender's rank in the communicator, its tag, the bytes.
struct Message {
  int source = -1;
  int tag = -1;
  std::string payload;
};

inline constexpr int kAnySource = MPI_ANY_SOURCE;
inline constexpr int kAnyTag = MPI_ANY_TAG;

// A communicator. Move-only; owns (and frees) communicators it created (split, dup), never
// MPI_COMM_WORLD. Every operation is collective over the communicator unless marked otherwise.
class Comm {
 public:
  static Comm world();                 // MPI_COMM_WORLD, errors returned (not owned)
  Comm() = default;                    // an empty handle (MPI_COMM_NULL)
  ~Comm();
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  bool valid() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm raw() const { return comm_; }  // for libraries that take an MPI_Comm (HDF5 MPI-IO)

  // MPI_Comm_split: ranks with the same colour form a communicator, ordered by key.
  Comm split(int color, int key) const;
  // MPI_Comm_dup: same group, separate message space (e.g. for the scheduler's messages).
  Comm dup() const;
  void barrier() const;

  void bcast(void* data, std::size_t bytes, int root = 0) const;  // any size (sent in 1 GiB pieces)
  void bcast(std::string& s, int root = 0) const;  // the root's string, resized on the others
  void bcast(std::int64_t& v, int root = 0) const;

  // In-place reductions over every rank: data[i] = sum (or max) over ranks of data[i].
  void allreduce_sum(double* data, std::size_t n) const;
  void allreduce_sum(float* data, std::size_t n) const;
  void allreduce_sum(std::int64_t* data, std::size_t n) const;
  void allreduce_max(double* data, std::size_t n) const;
  void allreduce_max(float* data, std::size_t n) const;
  void allreduce_max(std::int64_t* data, std::size_t n) const;
  std::int64_t allreduce_sum(std::int64_t v) const;
  std::int64_t allreduce_max(std::int64_t v) const;

  // Every rank's n values, in rank order: recv holds size() * n values (rank r's at r * n).
  void allgather(const float* send, std::size_t n, float* recv) const;
  void allgather(const double* send, std::size_t n, double* recv) const;
  void allgather(const std::int64_t* send, std::size_t n, std::int64_t* recv) const;

  // Personalised exchange of n values per pair: this rank sends send[q n, (q + 1) n) to rank q and
  // receives rank q's n values into recv[q n, (q + 1) n) (MPI_Alltoall).
  void alltoall(const std::int64_t* send, std::size_t n, std::int64_t* recv) const;

  // Personalised exchange: this rank sends send_bytes[q] bytes (consecutive in `send`, in rank order) to
  // rank q and receives recv_bytes[q] bytes from rank q into `recv` (consecutive, in rank order). The
  // counts must agree pairwise; each must be below 2 GiB, and so must the totals.
  void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes, void* recv,
                 const std::vector<std::size_t>& recv_bytes) const;

  // Strings of every rank, in rank order: on the root only (gather; empty elsewhere) or everywhere.
  std::vector<std::string> gather(const std::string& s, int root = 0) const;
  std::vector<std::string> allgather(const std::string& s) const;

  // Point-to-point messages (not collective). send blocks until the buffer may be reused (small
  // messages go eagerly); recv blocks until a matching message arrives; try_recv never blocks.
  void send(int dest, int tag, const std::string& payload) const;
  Message recv(int source = kAnySource, int tag = kAnyTag) const;
  std::optional<Message> try_recv(int source = kAnySource, int tag = kAnyTag) const;

 private:
  Comm(MPI_Comm c, bool owned);
  void release() noexcept;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 0;
};

// This rank in MPI_COMM_WORLD (0 when MPI is not initialised).
int world_rank();
// The number of processes a launcher started for this job, read from its environment before MPI is
// initialised: OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), PMI_SIZE (MPICH's Hydra, Intel MPI, srun
// --mpi=pmi2), SLURM_STEP_NUM_TASKS (srun); 0 when none is set (a process started by hand). A value
// that is not a positive number counts as unset.
int launched_ranks();
// MPI_Get_processor_name.
std::string processor_name();

// Prints "error: [rank R] message" to stderr, then MPI_Abort(MPI_COMM_WORLD, code): ends every rank
// of the job. Without MPI initialised it calls std::_Exit(code). Never returns.
[[noreturn]] void abort(int code, const std::string& message);

}  // namespace fastudy::mpi
