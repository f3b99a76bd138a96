// The only file that calls MPI. Each MPI function appears once; check() turns a non-success return
// code into an MpiError with the call name, the world rank and the file:line of the call.
#include "src/runtime/mpi.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <utility>

namespace fastudy::mpi {
namespace {

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

void check(int code, const char* call, const char* file, int line) {
  if (code != MPI_SUCCESS) throw MpiError(call, world_rank(), code, file, line);
}
#define FASTUDY_MPI(call, ...) check(call(__VA_ARGS__), #call, __FILE__, __LINE__)

int to_mpi(ThreadLevel t) {
  switch (t) {
    case ThreadLevel::single: return MPI_THREAD_SINGLE;
    case ThreadLevel::funneled: return MPI_THREAD_FUNNELED;
    case ThreadLevel::serialized: return MPI_THREAD_SERIALIZED;
    case ThreadLevel::multiple: return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

ThreadLevel from_mpi(int t) {
  if (t >= MPI_THREAD_MULTIPLE) return ThreadLevel::multiple;
  if (t >= MPI_THREAD_SERIALIZED) return ThreadLevel::serialized;
  if (t >= MPI_THREAD_FUNNELED) return ThreadLevel::funneled;
  return ThreadLevel::single;
}

// Open MPI 4 names every isolated singleton [[0,1],0], so concurrent singletons of one user on one host
// share the session directory TMP/ompi.HOST.UID/jf.0/1/0: the first to finish removes it while another
// creates or uses it ("A call to mkdir was unable to create the desired directory:
// /tmp/ompi.HOST.UID/jf.0", then MPI_Init fails). A top session directory of this process's own keeps
// them apart; Open MPI removes it at MPI_Finalize (orte_session_dir_cleanup), and only a killed process
// leaves it behind, as it would leave its part of the shared one. The place is Open MPI's own choice
// (orte_tmpdir_base, else TMPDIR, TEMP, TMP, else /tmp: opal_tmp_directory) with the process id added;
// the user's orte_top_session_dir wins.
void private_singleton_session_dir() {
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION == 4
  if (std::getenv("OMPI_MCA_orte_top_session_dir") != nullptr) return;
  std::string base = "/tmp";
  for (const char* name : {"OMPI_MCA_orte_tmpdir_base", "TMPDIR", "TEMP", "TMP"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      base = value;
      break;
    }
  }
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  std::string node(host);
  node = node.substr(0, node.find('.'));
  const std::string top = base + "/ompi." + node + "." + std::to_string(getuid()) + ".pid." + std::to_string(getpid());
  ::setenv("OMPI_MCA_orte_top_session_dir", top.c_str(), 0);
#endif
}

// The single places that call MPI_Initialized/MPI_Finalized, MPI_Comm_rank and MPI_Comm_set_errhandler
// (error paths need them without throwing).
bool mpi_active() noexcept {
  int init = 0, done = 0;
  if (MPI_Initialized(&init) != MPI_SUCCESS || MPI_Finalized(&done) != MPI_SUCCESS) return false;
  return init != 0 && done == 0;
}
int rank_in(MPI_Comm comm, int* rank) noexcept { return MPI_Comm_rank(comm, rank); }
void return_errors(MPI_Comm comm) {
  FASTUDY_MPI(MPI_Comm_set_errhandler, comm, MPI_ERRORS_RETURN);
}

int checked_count(std::size_t n) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw Error("MPI message of " + std::to_string(n) + " elements exceeds the int count MPI takes",
                "split the buffer into pieces of at most 2^31-1 elements");
  }
  return static_cast<int>(n);
}

void allreduce(void* data, std::size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  FASTUDY_MPI(MPI_Allreduce, MPI_IN_PLACE, data, checked_count(n), type, op, comm);
}

void allgather_values(const void* send, std::size_t n, MPI_Datatype type, void* recv, MPI_Comm comm) {
  FASTUDY_MPI(MPI_Allgather, send, checked_count(n), type, recv, checked_count(n), type, comm);
}

}  // namespace

MpiError::MpiError(std::string call, int rank, int code, const char* file, int line)
    : Error(call + " failed on rank " + std::to_string(rank) + " (" + file + ":" + std::to_string(line) +
            "): " + error_string(code)),
      call_(std::move(call)),
      rank_(rank),
      code_(code) {}

std::string_view to_string(ThreadLevel t) {
  switch (t) {
    case ThreadLevel::single: return "MPI_THREAD_SINGLE";
    case ThreadLevel::funneled: return "MPI_THREAD_FUNNELED";
    case ThreadLevel::serialized: return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::multiple: return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}

// ---- session ------------------------------------------------------------------------------------

bool MpiSession::initialized() { return mpi_active(); }

ThreadLevel MpiSession::provided_level() {
  if (!initialized()) return ThreadLevel::single;
  int provided = MPI_THREAD_SINGLE;
  FASTUDY_MPI(MPI_Query_thread, &provided);
  return from_mpi(provided);
}

MpiSession::MpiSession(int* argc, char*** argv, ThreadLevel requested, ThreadLevel required) {
  if (!initialized()) {
    // Open MPI busy-polls while a rank waits; with more ranks than free cores (shared or
    // oversubscribed nodes) the spinning rank steals the core the others need. Yielding costs
    // nothing measurable on a dedicated core. The user's setting, when given, wins.
    ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    // A singleton (no mpirun) never spawns processes: no need for Open MPI's helper daemon, which
    // would also outlive a killed process.
    if (!launched_by_mpirun()) {
      ::setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
      private_singleton_session_dir();
    }
    // HDF5 never uses MPI-IO shared file pointers; Open MPI's `sm` component for them fails with
    // "unable to open file for mmap" when its session directory is busy or gone (concurrent
    // singletons), which then fails H5Fcreate. Every entry point (fastudy, tests, benchmarks)
    // initialises MPI here, so the setting lives here; the user's own setting wins.
    ::setenv("OMPI_MCA_sharedfp", "^sm", 0);
    int provided = MPI_THREAD_SINGLE;
    FASTUDY_MPI(MPI_Init_thread, argc, argv, to_mpi(requested), &provided);
    owns_ = true;
  }
  return_errors(MPI_COMM_WORLD);
  set_process_rank(world_rank());
  provided_ = provided_level();
  if (static_cast<int>(provided_) < static_cast<int>(required)) {
    throw Error("the MPI library provides only " + std::string(to_string(provided_)) + ", fastudy needs " +
                    std::string(to_string(required)),
                "use an MPI built with thread support (Open MPI: --enable-mpi-thread-multiple)");
  }
}

MpiSession::~MpiSession() {
  if (owns_ && initialized()) MPI_Finalize();
}

bool MpiSession::launched_by_mpirun() const {
  return launched_ranks() > 0 || std::getenv("PMIX_RANK") != nullptr;
}

int launched_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != nullptr && *end == '\0' && n > 0 && n < (1L << 30)) return static_cast<int>(n);
  }
  return 0;
}

int world_rank() {
  int rank = 0;
  if (!mpi_active() || rank_in(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) return 0;
  return rank;
}

std::string processor_name() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  FASTUDY_MPI(MPI_Get_processor_name, name, &len);
  return std::string(name, static_cast<std::size_t>(len));
}

void abort(int code, const std::string& message) {
  // One write(2) of the whole line, so that lines of ranks aborting together do not interleave.
  const std::string line = "error: [rank " + std::to_string(world_rank()) + "] " + message + "\n";
  std::cerr << std::flush;
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---- communicators ------------------------------------------------------------------------------

Comm::Comm(MPI_Comm c, bool owned) : comm_(c), owned_(owned) {
  if (comm_ == MPI_COMM_NULL) return;
  if (owned_) return_errors(comm_);
  check(rank_in(comm_, &rank_), "MPI_Comm_rank", __FILE__, __LINE__);
  FASTUDY_MPI(MPI_Comm_size, comm_, &size_);
}

Comm Comm::world() { return Comm(MPI_COMM_WORLD, false); }

Comm::~Comm() { release(); }

void Comm::release() noexcept {
  if (owned_ && comm_ != MPI_COMM_NULL && MpiSession::initialized()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

Comm::Comm(Comm&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), owned_(std::exchange(o.owned_, false)),
      rank_(o.rank_), size_(o.size_) {}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(o.owned_, false);
    rank_ = o.rank_;
    size_ = o.size_;
  }
  return *this;
}

Comm Comm::split(int color, int key) const {
  MPI_Comm out = MPI_COMM_NULL;
  FASTUDY_MPI(MPI_Comm_split, comm_, color, key, &out);
  return Comm(out, true);
}

Comm Comm::dup() const {
  MPI_Comm out = MPI_COMM_NULL;
  FASTUDY_MPI(MPI_Comm_dup, comm_, &out);
  return Comm(out, true);
}

void Comm::barrier() const { FASTUDY_MPI(MPI_Barrier, comm_); }

void Comm::bcast(void* data, std::size_t bytes, int root) const {
  constexpr std::size_t kPiece = std::size_t{1} << 30;  // MPI counts are int: send large buffers in pieces
  auto* p = static_cast<char*>(data);
  do {
    const std::size_t n = std::min(bytes, kPiece);
    FASTUDY_MPI(MPI_Bcast, p, checked_count(n), MPI_BYTE, root, comm_);
    p += n;
    bytes -= n;
  } while (bytes > 0);
}

void Comm::bcast(std::string& s, int root) const {
  std::int64_t n = static_cast<std::int64_t>(s.size());
  bcast(n, root);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) bcast(s.data(), s.size(), root);
}

void Comm::bcast(std::int64_t& v, int root) const { bcast(&v, sizeof v, root); }

void Comm::allreduce_sum(double* d, std::size_t n) const { allreduce(d, n, MPI_DOUBLE, MPI_SUM, comm_); }
void Comm::allreduce_sum(float* d, std::size_t n) const { allreduce(d, n, MPI_FLOAT, MPI_SUM, comm_); }
void Comm::allreduce_sum(std::int64_t* d, std::size_t n) const { allreduce(d, n, MPI_INT64_T, MPI_SUM, comm_); }
void Comm::allreduce_max(double* d, std::size_t n) const { allreduce(d, n, MPI_DOUBLE, MPI_MAX, comm_); }
void Comm::allreduce_max(float* d, std::size_t n) const { allreduce(d, n, MPI_FLOAT, MPI_MAX, comm_); }
void Comm::allreduce_max(std::int64_t* d, std::size_t n) const { allreduce(d, n, MPI_INT64_T, MPI_MAX, comm_); }
void Comm::allgather(const float* send, std::size_t n, float* recv) const { allgather_values(send, n, MPI_FLOAT, recv, comm_); }
void Comm::allgather(const double* send, std::size_t n, double* recv) const { allgather_values(send, n, MPI_DOUBLE, recv, comm_); }
void Comm::allgather(const std::int64_t* send, std::size_t n, std::int64_t* recv) const {
  allgather_values(send, n, MPI_INT64_T, recv, comm_);
}
void Comm::alltoall(const std::int64_t* send, std::size_t n, std::int64_t* recv) const {
  FASTUDY_MPI(MPI_Alltoall, send, checked_count(n), MPI_INT64_T, recv, checked_count(n), MPI_INT64_T, comm_);
}
std::int64_t Comm::allreduce_sum(std::int64_t v) const { allreduce_sum(&v, 1); return v; }
std::int64_t Comm::allreduce_max(std::int64_t v) const { allreduce_max(&v, 1); return v; }

namespace {
// Concatenated strings plus their lengths -> the strings.
std::vector<std::string> unpack(const std::vector<int>& lens, const std::string& all) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (int len : lens) {
    out.push_back(all.substr(at, static_cast<std::size_t>(len)));
    at += static_cast<std::size_t>(len);
  }
  return out;
}
std::vector<int> displacements(const std::vector<int>& lens) {
  std::vector<int> displs(lens.size(), 0);
  for (std::size_t i = 1; i < lens.size(); ++i) displs[i] = displs[i - 1] + lens[i - 1];
  return displs;
}
}  // namespace

std::vector<std::string> Comm::gather(const std::string& s, int root) const {
  int len = checked_count(s.size());
  std::vector<int> lens(rank_ == root ? static_cast<std::size_t>(size_) : 0);
  FASTUDY_MPI(MPI_Gather, &len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm_);
  std::vector<int> displs = displacements(lens);
  std::string all(rank_ == root && size_ > 0 ? static_cast<std::size_t>(displs.back() + lens.back()) : 0, '\0');
  FASTUDY_MPI(MPI_Gatherv, s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root,
              comm_);
  if (rank_ != root) return {};
  return unpack(lens, all);
}

void Comm::alltoallv(const void* send, const std::vector<std::size_t>& send_bytes, void* recv,
                     const std::vector<std::size_t>& recv_bytes) const {
  const auto counts = [&](const std::vector<std::size_t>& bytes) {
    if (bytes.size() != static_cast<std::size_t>(size_))
      throw UsageError("alltoallv: " + std::to_string(bytes.size()) + " counts for " + std::to_string(size_) + " ranks");
    std::vector<int> c;
    std::size_t total = 0;
    for (std::size_t b : bytes) {
      c.push_back(checked_count(b));
      total += b;
    }
    checked_count(total);  // the displacements are ints too
    return c;
  };
  const std::vector<int> sc = counts(send_bytes), rc = counts(recv_bytes);
  const std::vector<int> sd = displacements(sc), rd = displacements(rc);
  FASTUDY_MPI(MPI_Alltoallv, send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_);
}

std::vector<std::string> Comm::allgather(const std::string& s) const {
  int len = checked_count(s.size());
  std::vector<int> lens(static_cast<std::size_t>(size_));
  FASTUDY_MPI(MPI_Allgather, &len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_);
  std::vector<int> displs = displacements(lens);
  std::string all(static_cast<std::size_t>(displs.back() + lens.back()), '\0');
  FASTUDY_MPI(MPI_Allgatherv, s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
              comm_);
  return unpack(lens, all);
}

void Comm::send(int dest, int tag, const std::string& payload) const {
  FASTUDY_MPI(MPI_Send, payload.data(), checked_count(payload.size()), MPI_CHAR, dest, tag, comm_);
}

namespace {
Message receive_probed(MPI_Comm comm, const MPI_Status& probed) {
  int count = 0;
  FASTUDY_MPI(MPI_Get_count, &probed, MPI_CHAR, &count);
  Message m;
  m.source = probed.MPI_SOURCE;
  m.tag = probed.MPI_TAG;
  m.payload.resize(static_cast<std::size_t>(count));
  FASTUDY_MPI(MPI_Recv, m.payload.data(), count, MPI_CHAR, m.source, m.tag, comm, MPI_STATUS_IGNORE);
  return m;
}
}  // namespace

Message Comm::recv(int source, int tag) const {
  MPI_Status status;
  FASTUDY_MPI(MPI_Probe, source, tag, comm_, &status);
  return receive_probed(comm_, status);
}

std::optional<Message> Comm::try_recv(int source, int tag) const {
  int flag = 0;
  MPI_Status status;
  FASTUDY_MPI(MPI_Iprobe, source, tag, comm_, &flag, &status);
  if (flag == 0) return std::nullopt;
  return receive_probed(comm_, status);
}

}  // namespace fastudy::mpi
