// The HDF5 reader process (hdf5_reader.hpp): the fork, the server loop, and the client the program's
// TensorFiles talk to. Messages are frames (an 8-byte length, then bytes of base/bytes.hpp) over a
// socketpair; requests: 'O' path (open: the tensors, or the refusal), 'R' file, tensor, begin, count,
// width (read a range: the values, or the refusal), 'C' file (close).
#include "src/io/hdf5_reader.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>

#include "base/bytes.hpp"
#include "base/error.hpp"
#include "base/quote.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy::io {
namespace {

// ---- frames ------------------------------------------------------------------------------------------

// Writes all of `bytes`; false when the other end is gone (never a SIGPIPE).
bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool send_frame(int fd, const std::string& bytes) {
  const std::uint64_t n = bytes.size();
  return write_all(fd, reinterpret_cast<const char*>(&n), sizeof n) && write_all(fd, bytes.data(), bytes.size());
}

enum class Got { frame, closed, timeout };

// Reads exactly n bytes, waiting at most until `deadline_ms` of the monotonic clock (-1: forever).
Got read_all(int fd, char* p, std::size_t n, long long deadline_ms) {
  while (n > 0) {
    if (deadline_ms >= 0) {
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      const long long left = deadline_ms - (now.tv_sec * 1000LL + now.tv_nsec / 1000000);
      if (left <= 0) return Got::timeout;
      pollfd pfd{fd, POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return Got::timeout;
    }
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Got::closed;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return Got::frame;
}

Got recv_frame(int fd, std::string& bytes, long long deadline_ms) {
  std::uint64_t n = 0;
  if (const Got g = read_all(fd, reinterpret_cast<char*>(&n), sizeof n, deadline_ms); g != Got::frame) return g;
  bytes.assign(static_cast<std::size_t>(n), '\0');
  return read_all(fd, bytes.data(), bytes.size(), deadline_ms);
}

// ---- the reader (the child) --------------------------------------------------------------------------

void put_refusal(ByteWriter& w, const UsageError& e) {
  w.put<std::uint8_t>(0);
  w.put_string(e.what());
  w.put_string(e.hint());
}

void put_entries(ByteWriter& w, const std::vector<TensorEntry>& entries) {
  w.put<std::uint64_t>(entries.size());
  for (const TensorEntry& e : entries) {
    w.put_string(e.name);
    w.put<std::int8_t>(e.format ? static_cast<std::int8_t>(*e.format) : std::int8_t{-1});
    w.put_string(e.stored_type);
    w.put<std::uint64_t>(e.shape.size());
    for (auto d : e.shape) w.put<std::int64_t>(d);
    w.put<std::uint64_t>(e.elements);
    w.put_string(e.file);
  }
}

// Answers one request.
std::string answer(const std::string& request, std::map<std::uint64_t, std::unique_ptr<TensorSource>>& files,
                   std::uint64_t& next) {
  ByteReader r(request, "a request to the HDF5 reader");
  ByteWriter w;
  const char op = r.get<char>();
  try {
    if (op == 'O') {
      const std::string path = r.get_string();
      std::unique_ptr<TensorSource> source;
      detail::name_errors(path, "", [&] { source = detail::open_hdf5_here(path); });
      w.put<std::uint8_t>(1);
      w.put<std::uint64_t>(next);
      put_entries(w, source->tensors());
      files[next++] = std::move(source);
    } else if (op == 'R') {
      const TensorSource& source = *files.at(r.get<std::uint64_t>());
      const TensorEntry& t = source.tensors().at(r.get<std::uint64_t>());
      const auto begin = r.get<std::uint64_t>(), count = r.get<std::uint64_t>();
      const bool wide = r.get<std::uint8_t>() != 0;
      std::string values(static_cast<std::size_t>(count) * (wide ? sizeof(double) : sizeof(float)), '\0');
      detail::name_errors(t.file, t.name, [&] {
        if (wide) source.read_range(t, begin, count, reinterpret_cast<double*>(values.data()));
        else source.read_range(t, begin, count, reinterpret_cast<float*>(values.data()));
      });
      w.put<std::uint8_t>(1);
      w.put_bytes(values.data(), values.size());
    } else {  // 'C'
      files.erase(r.get<std::uint64_t>());
      w.put<std::uint8_t>(1);
    }
  } catch (const UsageError& e) {
    w = ByteWriter();
    put_refusal(w, e);
  }
  return w.take();
}

[[noreturn]] void serve(int fd) {
  // A crash is the end of this process only: no handler of the program's runs here. A stop signal (a
  // Ctrl-C sent to the process group, Slurm's SIGTERM) is the program's to handle: the reader ends when
  // the program closes its socket or dies.
  for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, SIG_DFL);
  for (const int sig : {SIGTERM, SIGINT, SIGUSR1, SIGPIPE}) ::signal(sig, SIG_IGN);
  std::map<std::uint64_t, std::unique_ptr<TensorSource>> files;
  std::uint64_t next = 1;
  for (std::string request;;) {
    if (recv_frame(fd, request, -1) != Got::frame) break;
    if (!send_frame(fd, answer(request, files, next))) break;
  }
  // No exit handlers, no library teardown (HDF5's, MPI's): they belong to the program.
  ::_exit(0);
}

// ---- the client (the program) ------------------------------------------------------------------------

struct Reader {
  std::mutex mutex;
  void (*in_reader)() = nullptr;
  int fd = -1;
  pid_t pid = -1;
  bool down = false;        // crashed, hung or gone: nothing more is asked of it
  std::string down_because; // "it crashed reading '<file>' (signal 11: Segmentation fault)"
  unsigned generation = 0;  // how many readers were started: a file opened by an earlier one is reopened
};
Reader& reader() {
  static Reader r;
  return r;
}

void fork_reader(Reader& r, void (*in_reader)()) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw Error(std::string("cannot make the HDF5 reader's socket: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    throw Error(std::string("cannot start the HDF5 reader process: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::close(sv[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the program
    if (::getppid() != parent) ::_exit(0);
    if (in_reader != nullptr) in_reader();
    serve(sv[1]);
  }
  ::close(sv[1]);
  r.fd = sv[0];
  r.pid = pid;
  r.down = false;
  ++r.generation;
}

// Why the reader ended: its exit status, once it is reaped.
std::string ending_of(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + ": " + std::string(::strsignal(WTERMSIG(status)));
  return "exit code " + std::to_string(WEXITSTATUS(status));
}

void take_down(Reader& r, const std::string& because) {
  ::close(r.fd);
  r.fd = -1;
  r.down = true;
  r.down_because = because;
}

// One request for `file` (and `tensor`): the answer's body after its status byte, or the reader's
// refusal, crash or silence as a UsageError naming the file. `generation`: the reader that opened the
// file (0 for an open: the reader now, which a process without MPI starts anew after a crash). Holds
// the reader's lock.
std::string ask(const std::string& request, const std::string& file, const std::string& tensor, unsigned& generation) {
  Reader& r = reader();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string what = "'" + file + "': " + (tensor.empty() ? std::string() : "tensor " + quoted_name(tensor) + ": ");
  const char* hint = "the file is damaged or crafted: write it again (h5py), or leave the run out of [grid]";
  if (generation == 0 && r.down && !mpi::MpiSession::initialized()) fork_reader(r, r.in_reader);
  if (r.down) throw UsageError(what + "HDF5 cannot read it: the HDF5 reader process stopped (" + r.down_because + ")", hint);
  if (generation != 0 && generation != r.generation)
    throw UsageError(what + "HDF5 cannot read it: the HDF5 reader that opened it stopped (" + r.down_because + ")", hint);
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const long long deadline = now.tv_sec * 1000LL + now.tv_nsec / 1000000 + kReaderSeconds * 1000LL;
  std::string reply;
  const Got got = send_frame(r.fd, request) ? recv_frame(r.fd, reply, deadline) : Got::closed;
  if (got == Got::timeout) {
    ::kill(r.pid, SIGKILL);
    ending_of(r.pid);
    take_down(r, "it did not answer within " + std::to_string(kReaderSeconds) + " s reading '" + file + "'");
    throw UsageError(what + "HDF5 did not answer within " + std::to_string(kReaderSeconds) +
                         " s reading it (a file crafted to make it loop, or storage that slow)",
                     hint);
  }
  if (got == Got::closed) {
    const std::string ending = ending_of(r.pid);
    take_down(r, "it crashed reading '" + file + "' (" + ending + ")");
    throw UsageError(what + "HDF5 crashed reading it (" + ending + ")", hint);
  }
  generation = r.generation;
  ByteReader in(reply, "the HDF5 reader's answer");
  if (in.get<std::uint8_t>() == 0) {
    std::string message = in.get_string();
    throw UsageError(message, in.get_string());
  }
  return reply.substr(1);
}

// A file opened in the reader: its tensors here, its values read there.
class ReaderSource : public TensorSource {
 public:
  explicit ReaderSource(const std::string& path) : path_(path) {
    ByteWriter w;
    w.put<char>('O');
    w.put_string(path);
    const std::string body = ask(w.bytes(), path, "", generation_);
    ByteReader r(body, "the HDF5 reader's answer");
    id_ = r.get<std::uint64_t>();
    for (auto n = r.get<std::uint64_t>(); n > 0; --n) {
      TensorEntry e;
      e.name = r.get_string();
      if (const auto f = r.get<std::int8_t>(); f >= 0) e.format = static_cast<Format>(f);
      e.stored_type = r.get_string();
      for (auto d = r.get<std::uint64_t>(); d > 0; --d) e.shape.push_back(r.get<std::int64_t>());
      e.elements = r.get<std::uint64_t>();
      e.file = r.get_string();
      entries_.push_back(std::move(e));
    }
  }
  ~ReaderSource() override {
    ByteWriter w;
    w.put<char>('C');
    w.put<std::uint64_t>(id_);
    try {
      ask(w.bytes(), path_, "", generation_);
    } catch (const std::exception&) {  // the reader that opened it is down: nothing to close
    }
  }
  ReaderSource(const ReaderSource&) = delete;
  ReaderSource& operator=(const ReaderSource&) = delete;
  const std::vector<TensorEntry>& tensors() const override { return entries_; }
  std::vector<std::string> files() const override { return {path_}; }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const override {
    read_as(t, begin, count, out, true);
  }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const override {
    read_as(t, begin, count, out, false);
  }

 private:
  void read_as(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, void* out, bool wide) const {
    ByteWriter w;
    w.put<char>('R');
    w.put<std::uint64_t>(id_);
    w.put<std::uint64_t>(static_cast<std::uint64_t>(&t - entries_.data()));
    w.put<std::uint64_t>(begin);
    w.put<std::uint64_t>(count);
    w.put<std::uint8_t>(wide);
    const std::string values = ask(w.bytes(), path_, t.name, generation_);
    const std::size_t bytes = static_cast<std::size_t>(count) * (wide ? sizeof(double) : sizeof(float));
    if (values.size() != bytes)
      throw Error("the HDF5 reader sent " + std::to_string(values.size()) + " bytes of tensor " + quoted_name(t.name) +
                  " in '" + path_ + "', not " + std::to_string(bytes));
    std::memcpy(out, values.data(), bytes);
  }
  std::string path_;
  std::uint64_t id_ = 0;
  mutable unsigned generation_ = 0;
  std::vector<TensorEntry> entries_;
};

}  // namespace

void start_hdf5_reader(void (*in_reader)()) {
  Reader& r = reader();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.in_reader = in_reader;
  if (r.generation == 0) fork_reader(r, in_reader);
}

bool hdf5_reader_started() {
  Reader& r = reader();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.generation > 0;
}

std::unique_ptr<TensorSource> open_hdf5_in_reader(const std::string& path) { return std::make_unique<ReaderSource>(path); }

}  // namespace fastudy::io
