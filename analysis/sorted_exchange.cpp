// One task's pairwise partial sums on one rank or split over the ranks (sorted_exchange.hpp): the
// sorted arrays exchanged through node-shared memory or MPI_Alltoallv.
#include "analysis/sorted_exchange.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "base/log.hpp"
#include "base/number.hpp"

namespace fastudy {

namespace fs = std::filesystem;

namespace {

// The elementwise partial sums over window w of every variant's unsorted values.
template <class T>
void add_elementwise_window(std::size_t variants, const VariantValues<T>& values, IndexRange w, PairwisePartials& p) {
  std::vector<std::vector<T>> raw;
  std::vector<const T*> ptrs;
  for (std::size_t v = 0; v < variants; ++v) {
    raw.emplace_back(w.end - w.begin);
    values(v, w.begin, w.end, raw.back().data());
    ptrs.push_back(raw.back().data());
  }
  accumulate_elementwise(ptrs, w.begin, w.end, p, w.begin);
}

// Every value of variant v, sorted.
template <class T>
std::vector<T> sorted_values(const VariantValues<T>& values, std::size_t v, std::size_t n) {
  std::vector<T> x(n);
  values(v, 0, n, x.data());
  radix_sort(x.data(), n);
  return x;
}

}  // namespace

template <class T>
PairwisePartials local_partials(std::size_t variants, std::size_t n, const VariantValues<T>& values,
                                bool elementwise) {
  if (elementwise) {
    std::vector<std::vector<T>> raw;
    std::vector<const T*> ptrs;
    for (std::size_t v = 0; v < variants; ++v) {
      raw.emplace_back(n);
      values(v, 0, n, raw.back().data());
      ptrs.push_back(raw.back().data());
    }
    return pairwise_partials(ptrs, n);
  }
  SortedSet<T> set;
  for (std::size_t v = 0; v < variants; ++v) set.add_sorted(sorted_values(values, v, n));
  PairwisePartials p(variants);
  accumulate_sorted(set, 0, n, p);
  return p;
}

SortedExchange::SortedExchange(const mpi::Comm& world, std::size_t variants, std::size_t largest_task) {
  if (world.size() == 1) return;
  const char* opt = std::getenv("FASTUDY_REDUCE_SHARED");
  const bool wanted = !(opt && std::string(opt) == "0");
  mpi::Comm node = world.split_shared();
  std::int64_t problem = 0;
  std::string why = "FASTUDY_REDUCE_SHARED=0";
  if (!wanted) {
    problem = 1;
  } else if (node.is_root()) {
    const char* dir_env = std::getenv("OMPI_MCA_osc_sm_backing_directory");
    const std::string dir = dir_env && *dir_env ? dir_env : "/dev/shm";
    const std::uintmax_t need = static_cast<std::uintmax_t>(largest_task) * variants * sizeof(double);  // fp64 at most
    std::error_code ec;
    const fs::space_info room = fs::space(dir, ec);
    if (ec || room.available < need + need / 8) {
      problem = 1;
      why = dir + " has " + (ec ? "no usable space (" + ec.message() + ")" : number_text(room.available / 1e9) + " GB free") +
            ", the sorted arrays need " + number_text(need / 1e9) + " GB";
    }
  }
  if (world.allreduce_max(problem) != 0) {
    log::info("reduce: exchanging sorted arrays with MPI_Alltoallv, not node-shared memory (" +
              (problem ? why : std::string("another node's shared-memory directory is too small")) + ")");
    return;
  }
  shared_ = true;
  node_ = std::move(node);
}

template <class T>
PairwisePartials SortedExchange::split_partials(const mpi::Comm& world, std::size_t variants, std::size_t n,
                                                const VariantValues<T>& values, bool elementwise) {
  return shared_ ? split_partials_shared<T>(world, variants, n, values, elementwise)
                 : split_partials_alltoallv<T>(world, variants, n, values, elementwise);
}

// Through node-shared memory: local rank l of L sorts the variants l, l+L, ... into its segment; after
// publish() every rank reads the sorted windows of every variant in place.
template <class T>
PairwisePartials SortedExchange::split_partials_shared(const mpi::Comm& world, std::size_t variants, std::size_t n,
                                                       const VariantValues<T>& values, bool elementwise) {
  const std::size_t V = variants;
  const std::size_t L = static_cast<std::size_t>(node_.size()), l = static_cast<std::size_t>(node_.rank());
  const std::size_t mine = V > l ? (V - l + L - 1) / L : 0;  // variants l, l+L, ...
  const std::size_t need = mine * n * sizeof(T);
  const bool grow = !window_.valid() || need > window_.bytes(node_.rank());
  if (node_.allreduce_max(static_cast<std::int64_t>(grow)) != 0) {
    window_ = mpi::SharedWindow();  // free the old one first (collective)
    window_ = mpi::SharedWindow(node_, need);
  }
  T* segment = static_cast<T*>(window_.mine());
  for (std::size_t v = l, k = 0; v < V; v += L, ++k) {
    values(v, 0, n, segment + k * n);
    radix_sort(segment + k * n, n);
  }
  window_.publish();
  const IndexRange w = block_aligned_part(n, static_cast<std::size_t>(world.size()), static_cast<std::size_t>(world.rank()));
  SortedSet<T> set;
  for (std::size_t v = 0; v < V; ++v) {
    const T* sorted = static_cast<const T*>(window_.segment(static_cast<int>(v % L))) + (v / L) * n;
    set.add_sorted_view(sorted + w.begin, w.end - w.begin, w.begin, n);
  }
  PairwisePartials p(V);
  accumulate_sorted(set, w.begin, w.end, p);
  window_.publish();  // every rank of the node has read the segments: the next task may write them
  if (elementwise) add_elementwise_window<T>(V, values, w, p);
  return p;
}

// By MPI_Alltoallv: rank r sorts the variants v = r (mod R) and sends each rank q the window q
// (block_aligned_part) of those sorted arrays (one alltoallv: every rank receives its window of every
// variant, V n / R values); each rank accumulates its window of the sorted positions and, with
// elementwise = true, of the elementwise indices (each variant's unsorted window, from `values`).
template <class T>
PairwisePartials SortedExchange::split_partials_alltoallv(const mpi::Comm& world, std::size_t variants, std::size_t n,
                                                          const VariantValues<T>& values, bool elementwise) {
  const std::size_t V = variants;
  const std::size_t R = static_cast<std::size_t>(world.size()), r = static_cast<std::size_t>(world.rank());
  const auto owned = [&](std::size_t q) { return V > q ? (V - q + R - 1) / R : 0; };  // variants q, q+R, ...
  std::vector<IndexRange> windows;
  for (std::size_t q = 0; q < R; ++q) windows.push_back(block_aligned_part(n, R, q));
  const auto length = [&](std::size_t q) { return windows[q].end - windows[q].begin; };
  // Send: to rank q, window q of each of my sorted variants, in variant order.
  std::vector<T> send(owned(r) * n);
  std::vector<std::size_t> send_bytes(R), recv_bytes(R);
  {
    std::size_t k = 0;
    for (std::size_t v = r; v < V; v += R, ++k) {
      const std::vector<T> sorted = sorted_values(values, v, n);
      for (std::size_t q = 0, at = 0; q < R; at += owned(r) * length(q), ++q)
        std::copy(sorted.begin() + static_cast<std::ptrdiff_t>(windows[q].begin),
                  sorted.begin() + static_cast<std::ptrdiff_t>(windows[q].end),
                  send.begin() + static_cast<std::ptrdiff_t>(at + k * length(q)));
    }
  }
  for (std::size_t q = 0; q < R; ++q) {
    send_bytes[q] = owned(r) * length(q) * sizeof(T);
    recv_bytes[q] = owned(q) * length(r) * sizeof(T);
  }
  // Receive: from rank q, my window of its variants q, q+R, ...
  std::vector<T> recv(V * length(r));
  world.alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  send = {};
  const IndexRange w = windows[r];
  SortedSet<T> set;
  std::vector<std::size_t> first(R, 0);  // where rank q's variants start in recv
  for (std::size_t q = 1; q < R; ++q) first[q] = first[q - 1] + owned(q - 1) * length(r);
  for (std::size_t v = 0; v < V; ++v) {
    const T* window = recv.data() + first[v % R] + (v / R) * length(r);
    set.add_sorted_window(std::vector<T>(window, window + length(r)), w.begin, n);
  }
  recv = {};
  PairwisePartials p(V);
  accumulate_sorted(set, w.begin, w.end, p);
  if (elementwise) add_elementwise_window<T>(V, values, w, p);
  return p;
}

void allreduce_partials(const mpi::Comm& world, PairwisePartials& partials) {
  world.allreduce_sum(partials.sums(), partials.sums_size());
  world.allreduce_max(partials.maxima(), partials.maxima_size());
}

template PairwisePartials local_partials<float>(std::size_t, std::size_t, const VariantValues<float>&, bool);
template PairwisePartials local_partials<double>(std::size_t, std::size_t, const VariantValues<double>&, bool);
template PairwisePartials SortedExchange::split_partials<float>(const mpi::Comm&, std::size_t, std::size_t,
                                                                const VariantValues<float>&, bool);
template PairwisePartials SortedExchange::split_partials<double>(const mpi::Comm&, std::size_t, std::size_t,
                                                                 const VariantValues<double>&, bool);

}  // namespace fastudy
