// Checkpoint write throughput against plain write() of the same bytes to the same disk, side by side.
//
// Run (2 ranks, the figure):
//   mpirun -n 2 build/bench/runner/checkpoint_write_bench [--mb 64] [--reps 5] [--dir DIR] [--only NAME]
// (--only: just the methods whose name contains NAME, e.g. "checkpoint collective", for a profiler;
// the ratio column then needs the posix rows, so it reads 0 without them)
// Every repetition writes a new file (as training does, step after step); deleting it is not timed.
// It builds a TrainState of --mb MiB of fp32 parameters (16 tensors, like a small transformer's
// matrices) and times, median of --reps runs each, on the same directory:
//   posix write() 1 rank      rank 0 writes every byte with write() into one file
//   posix pwrite() all ranks  each rank writes its half (contiguous range) of one file with pwrite()
//   checkpoint collective     write_checkpoint: parallel HDF5, collective transfers, CRC-32, rename
//   checkpoint independent    the same with independent transfers (CheckpointOptions::collective)
// each without and with durability ("durable": fsync before the time is taken; for the checkpoint:
// its verify pass and fsyncs). The ratio column is checkpoint throughput / posix write() throughput
// of the same durability (ratio_med from the medians, ratio_best from the best runs: on a shared,
// loaded machine the best run is the least disturbed one). Rank 0 prints the table.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "src/io/checkpoint.hpp"
#include "src/runtime/mpi.hpp"

namespace {

using fastudy::mpi::Comm;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

fastudy::TrainState make_state(std::size_t mib) {
  fastudy::TrainState s;
  s.step = 1000;
  const std::int64_t tensors = 16;
  const std::int64_t cols = 1024;
  const std::int64_t rows = static_cast<std::int64_t>(mib) * (1 << 20) / 4 / cols / tensors;
  for (std::int64_t t = 0; t < tensors; ++t) {
    fastudy::NamedArray a;
    a.name = "blocks." + std::to_string(t / 4) + ".w" + std::to_string(t % 4) + ".weight";
    a.shape = {rows, cols};
    a.data.resize(static_cast<std::size_t>(rows * cols) * 4);
    float* p = a.as<float>();
    for (std::int64_t i = 0; i < rows * cols; ++i) p[i] = static_cast<float>((i * 2654435761u + t) % 1000003) * 1e-6f;
    s.params.push_back(std::move(a));
  }
  s.attrs["variant"] = "bench";
  return s;
}

void write_all(int fd, const char* p, std::size_t n, off_t at) {
  while (n > 0) {
    const ssize_t k = ::pwrite(fd, p, n, at);
    if (k < 0) throw fastudy::Error(std::string("pwrite failed: ") + std::strerror(errno));
    p += k;
    at += k;
    n -= static_cast<std::size_t>(k);
  }
}

// One contiguous buffer of the state's bytes (what a plain dump would write).
std::vector<char> flatten(const fastudy::TrainState& s) {
  std::vector<char> out;
  for (const auto& a : s.params) out.insert(out.end(), reinterpret_cast<const char*>(a.data.data()),
                                            reinterpret_cast<const char*>(a.data.data()) + a.data.size());
  return out;
}

struct Times {
  double median = 0, best = 0;
};

Times summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

}  // namespace

int main(int argc, char** argv) {
  fastudy::mpi::MpiSession session(&argc, &argv);
  Comm world = Comm::world();
  std::size_t mib = 64;
  int reps = 5;
  std::string dir = "bench-checkpoint-tmp";
  std::string only;  // --only SUBSTRING: run just the methods whose name contains it (for profiling)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--mb") mib = std::stoul(argv[i + 1]);
    else if (k == "--reps") reps = std::stoi(argv[i + 1]);
    else if (k == "--dir") dir = argv[i + 1];
    else if (k == "--only") only = argv[i + 1];
  }
  try {
    if (world.is_root()) std::filesystem::create_directories(dir);
    world.barrier();
    const fastudy::TrainState state = make_state(mib);
    const std::vector<char> flat = flatten(state);
    const double bytes = static_cast<double>(flat.size());

    // The methods, each a body run once per repetition. Repetitions interleave the methods, so a
    // change of machine load during the run hits every method alike.
    struct Method {
      std::string name;
      bool durable;
      std::function<fastudy::CheckpointWriteStats(int rep)> body;  // what a checkpoint write saw
      std::function<std::string(int rep)> output;  // the file a repetition wrote, removed untimed
      std::vector<double> seconds;
      std::vector<fastudy::CheckpointWriteStats> phases;  // checkpoint methods: rank 0's, per repetition
    };
    std::vector<Method> methods;
    auto posix_file = [&](int rep) { return dir + "/posix_" + std::to_string(rep) + ".bin"; };
    auto checkpoint_file = [&](int rep) { return fastudy::checkpoint_path(dir, "bench", rep); };
    for (bool durable : {false, true}) {
      methods.push_back({"posix write() 1 rank", durable, [&, durable](int rep) {
                           if (!world.is_root()) return fastudy::CheckpointWriteStats{};
                           int fd = ::open(posix_file(rep).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
                           write_all(fd, flat.data(), flat.size(), 0);
                           if (durable) ::fsync(fd);
                           ::close(fd);
                           return fastudy::CheckpointWriteStats{};
                         }, posix_file, {}, {}});
      methods.push_back({"posix pwrite() all ranks", durable, [&, durable](int rep) {
                           if (world.is_root()) ::close(::open(posix_file(rep).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
                           world.barrier();
                           const std::size_t P = static_cast<std::size_t>(world.size());
                           const std::size_t r = static_cast<std::size_t>(world.rank());
                           const std::size_t b0 = flat.size() * r / P, b1 = flat.size() * (r + 1) / P;
                           int fd = ::open(posix_file(rep).c_str(), O_WRONLY);
                           write_all(fd, flat.data() + b0, b1 - b0, static_cast<off_t>(b0));
                           if (durable) ::fsync(fd);
                           ::close(fd);
                           return fastudy::CheckpointWriteStats{};
                         }, posix_file, {}, {}});
      for (bool collective : {true, false}) {
        methods.push_back({std::string("checkpoint ") + (collective ? "collective" : "independent"), durable,
                           [&, durable, collective](int rep) {
                             fastudy::CheckpointOptions opt;
                             opt.verify = durable;
                             opt.fsync = durable;
                             opt.collective = collective;
                             return write_checkpoint(world, checkpoint_file(rep), state, opt);
                           }, checkpoint_file, {}, {}});
      }
    }
    if (!only.empty()) {
      methods.erase(std::remove_if(methods.begin(), methods.end(),
                                   [&](const Method& m) { return m.name.find(only) == std::string::npos; }),
                    methods.end());
    }
    for (int rep = 0; rep < reps; ++rep) {
      for (auto& m : methods) {
        world.barrier();
        const double t0 = now_s();
        const fastudy::CheckpointWriteStats st = m.body(rep);
        world.barrier();
        double dt = now_s() - t0;
        world.allreduce_max(&dt, 1);
        m.seconds.push_back(dt);
        m.phases.push_back(st);
        // Every repetition writes a new file, as training does; removing it is not timed.
        if (world.is_root()) std::filesystem::remove(m.output(rep));
      }
    }
    struct Row {
      std::string method;
      bool durable;
      Times t;
    };
    std::vector<Row> rows;
    for (const auto& m : methods) {
      rows.push_back({m.name, m.durable, summarize(m.seconds)});
      std::int64_t transfers = 0, collective_transfers = 0;
      for (const auto& st : m.phases) {
        transfers += st.transfers;
        collective_transfers += st.collective_transfers;
      }
      if (world.is_root() && transfers > 0) {
        // Medians over the repetitions, phase by phase (a loaded machine makes means jump).
        auto med = [&](double fastudy::CheckpointWriteStats::*field) {
          std::vector<double> v;
          for (const auto& st : m.phases) v.push_back(st.*field);
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        using S = fastudy::CheckpointWriteStats;
        std::printf("# %s%s, rank 0 median phases: call %.4f s = write %.4f s (create %.4f, transfer %.4f, checksum %.4f, "
                    "close %.4f) + verify %.4f s + commit %.4f s (sidecar sum %.4f) + setup; %lld of %lld transfers "
                    "collective\n",
                    m.name.c_str(), m.durable ? " (verify+fsync)" : "", med(&S::seconds), med(&S::write_seconds), med(&S::create_seconds),
                    med(&S::transfer_seconds), med(&S::checksum_seconds), med(&S::close_seconds),
                    med(&S::verify_seconds), med(&S::commit_seconds), med(&S::sum_seconds),
                    static_cast<long long>(collective_transfers), static_cast<long long>(transfers));
      }
    }
    if (world.is_root()) {
      std::printf("# checkpoint write throughput: %d ranks, %.1f MiB of fp32 parameters, median and best of %d interleaved runs, dir %s\n",
                  world.size(), bytes / (1 << 20), reps, dir.c_str());
      std::printf("%-26s %-8s %10s %10s %10s %10s %12s %12s\n", "method", "durable", "median_s", "best_s",
                  "MB/s_med", "MB/s_best", "ratio_med", "ratio_best");
      for (const auto& r : rows) {
        Times base;
        for (const auto& b : rows) {
          if (b.durable == r.durable && b.method == "posix write() 1 rank") base = b.t;
        }
        std::printf("%-26s %-8s %10.4f %10.4f %10.1f %10.1f %12.2f %12.2f\n", r.method.c_str(),
                    r.durable ? "yes" : "no", r.t.median, r.t.best, bytes / r.t.median / 1e6, bytes / r.t.best / 1e6,
                    base.median / r.t.median, base.best / r.t.best);
      }
      std::filesystem::remove_all(dir);
    }
    return 0;
  } catch (const std::exception& e) {
    fastudy::mpi::abort(1, e.what());
  }
}
