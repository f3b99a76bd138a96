// `fastudy reduce GRID.toml|OUT`: how far apart did the variants' weights drift, and which grid axis
// moved them most. Reads the checkpoints, computes for every checkpoint step the pairwise matrices
// (W1, W2, max |d|, mean |d|, relative L2) per tensor and for the whole model (all parameters
// flattened), and ranks the axes as deviation sources (analysis/ranking.hpp).
//
// Work split: the tasks are (step, tensor) pairs plus one whole-model task per step. Small tensors are
// dealt to the ranks by size (largest first, to the least loaded) and computed whole by one rank. The
// whole model and every tensor of at least kSplitElements values are split over all ranks by element
// range (analysis/distance.hpp): rank r sorts the variants r, r+R, ..., the sorted arrays are
// exchanged, and every rank accumulates its block-aligned part of the sorted positions (and of the
// elementwise indices); the exact partial sums are combined with MPI_Allreduce. The whole model's
// elementwise sums (max |d|, mean |d|, relative L2) are those of its tensors added up
// (PairwisePartials::combine_elementwise), so it needs only the sorted pass of its own. Block-aligned
// splits give bit-identical sums, so the results do not depend on the number of ranks either way.
// Rank 0 gathers them in task order and writes
//   OUT/deviation.h5   /steps/<step>/<tensor>/{w1,w2,max_abs,mean_abs,rel_l2}: V x V matrices
//   OUT/deviation.csv  one row per step, tensor and pair (tensor "model" is the whole model)
//   OUT/axes.csv       each grid axis's role, baseline, replicate flag and values (the verdict's input)
//   OUT/ranking.csv    one row per source (axis), condition ("*": pooled) and value pair, and step
//   OUT/verdict.csv    one row per optimisation, value, condition and reference: the verdict
//   OUT/twins.csv      each variant's distance to its fp64 twin, when the grid has fp64
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include <boost/program_options.hpp>

#include "analysis/distance.hpp"
#include "analysis/ranking.hpp"
#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/number.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "src/io/checkpoint.hpp"
#include "src/io/h5.hpp"
#include "src/runtime/mpi.hpp"

namespace fs = std::filesystem;

namespace po = boost::program_options;

namespace fastudy {

namespace {

constexpr const char* kModel = "model";  // the whole-model pseudo-tensor
constexpr int kMetrics = 5;              // w1, w2, max_abs, mean_abs, rel_l2
const char* kMetricNames[kMetrics] = {"w1", "w2", "max_abs", "mean_abs", "rel_l2"};

struct Plan {
  std::vector<const Variant*> variants;  // those reduced (left-out ones excluded)
  std::vector<std::string> left_out;     // "id: reason"
  std::vector<std::int64_t> steps;
  std::vector<std::string> tensors;      // parameter names, then "model"
  std::vector<std::int64_t> sizes;       // elements of each parameter (read from the first variant)
};


// The checkpoint steps reduce reads: [reduce] steps, or every checkpoint step (throws UsageError for a
// listed step that is not a checkpoint step).
std::set<std::int64_t> reduced_steps(const Study& st) {
  std::set<std::int64_t> expected;
  for (std::int64_t s = st.train.checkpoint_every; s < st.train.steps; s += st.train.checkpoint_every) expected.insert(s);
  expected.insert(st.train.steps);
  if (!st.reduce.steps.empty()) {
    for (auto s : st.reduce.steps)
      if (!expected.count(s))
        throw UsageError("[reduce] steps lists step " + std::to_string(s) + ", which is not a checkpoint step",
                         "checkpoints are written every " + std::to_string(st.train.checkpoint_every) +
                             " steps and at step " + std::to_string(st.train.steps));
    expected = std::set<std::int64_t>(st.reduce.steps.begin(), st.reduce.steps.end());
  }
  return expected;
}

// The first problem of variant v's checkpoints at `steps` ("" when they are all there and intact).
std::string checkpoints_problem(const std::string& out, const Variant& v, const std::set<std::int64_t>& steps) {
  for (auto s : steps) {
    const std::string path = checkpoint_path(out, v.id, s);
    if (!fs::exists(path)) return path + " is missing";
    if (auto p = checkpoint_problem(path)) return *p;
  }
  return {};
}

// Rank 0: which variants and steps to reduce, from every variant's checkpoint problem (checked by all
// ranks, a share each); missing or corrupt checkpoints are errors naming the file unless
// --allow-missing, which leaves the variant out.
Plan make_plan(const Study& st, const std::string& out, bool allow_missing, const std::vector<std::string>& problems) {
  Plan plan;
  const std::set<std::int64_t> expected = reduced_steps(st);
  for (std::size_t i = 0; i < st.variants.size(); ++i) {
    const Variant& v = st.variants[i];
    const std::string& problem = problems[i];
    if (problem.empty()) {
      plan.variants.push_back(&v);
      continue;
    }
    if (!allow_missing)
      throw Error("cannot reduce variant " + v.id + ": " + problem,
                  "train or repair it first: fastudy train " + shell_quote(st.file) + " --out " + shell_quote(out) +
                      " --resume (it retrains from the last good checkpoint), or pass --allow-missing to leave it out");
    log::warn("leaving out " + v.id + ": " + problem);
    plan.left_out.push_back(v.id + ": " + problem);
  }
  if (plan.variants.size() < 2)
    throw Error("fewer than two variants have complete checkpoints in " + out + "; nothing to compare",
                "run the train phase first (fastudy train GRID.toml)");
  plan.steps.assign(expected.begin(), expected.end());
  for (const auto& a : read_params(checkpoint_path(out, plan.variants[0]->id, plan.steps[0]))) {
    plan.tensors.push_back(a.name);
    plan.sizes.push_back(a.numel());
  }
  plan.tensors.push_back(kModel);
  return plan;
}

std::string pack_plan(const Plan& p) {
  std::ostringstream os;
  for (const auto* v : p.variants) os << "v " << v->id << '\n';
  for (const auto& s : p.left_out) os << "l " << s << '\n';
  for (auto s : p.steps) os << "s " << s << '\n';
  for (const auto& t : p.tensors) os << "t " << t << '\n';
  for (auto n : p.sizes) os << "n " << n << '\n';
  return os.str();
}

Plan unpack_plan(const std::string& text, const Study& st) {
  Plan p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::string body = line.substr(2);
    switch (line[0]) {
      case 'v': p.variants.push_back(st.find_variant(body)); break;
      case 'l': p.left_out.push_back(body); break;
      case 's': p.steps.push_back(std::stoll(body)); break;
      case 't': p.tensors.push_back(body); break;
      case 'n': p.sizes.push_back(std::stoll(body)); break;
    }
  }
  return p;
}

// A tensor this large (elements) is split over the ranks rather than computed by one: below it the
// exchange of sorted arrays costs more than it saves.
constexpr std::size_t kSplitElements = std::size_t{1} << 18;

// Parameters of every variant at one step, as double when any variant stores f64, else float.
struct StepParams {
  bool f64 = false;
  std::vector<std::vector<NamedArray>> per_variant;
};

// Every variant's parameters at one step. Every rank reads them all (from the page cache that is
// cheaper than reading a share and exchanging the arrays: 0.27 s to read 12 checkpoints of 3.3M
// parameters, 0.8 s to pack and allgather half of them), without the whole-file pass: the check
// before the work verified every file against its sidecar (the crc32 of each dataset is checked).
std::vector<std::vector<NamedArray>> read_step_params(const Plan& plan, const std::string& out, std::int64_t step) {
  std::vector<std::vector<NamedArray>> arrays;
  for (const auto* v : plan.variants)
    arrays.push_back(read_params(checkpoint_path(out, v->id, step), {}, WholeFile::checked_before));
  return arrays;
}

// Values [begin, end) of variant v's `tensor` (kModel: all parameters concatenated in file order),
// converted to T, into dst (end - begin values). Copies only that range.
template <class T>
void flatten_into(T* dst, const StepParams& sp, std::size_t v, const std::string& tensor,
                  const std::vector<std::string>& names, std::size_t begin, std::size_t end) {
  const std::vector<NamedArray>& arrays = sp.per_variant[v];
  std::size_t at = 0;  // index of the current tensor's first value in the (concatenated) tensor
  for (std::size_t t = 0; t < arrays.size() && at < end; ++t) {
    if (tensor != kModel && names[t] != tensor) continue;
    const NamedArray& a = arrays[t];
    const std::size_t n = static_cast<std::size_t>(a.numel());
    const std::size_t lo = std::max(begin, at), hi = std::min(end, at + n);
    if (lo < hi) {
      T* out = dst + (lo - begin);
      if (a.dtype == DType::f64) std::copy(a.as<double>() + (lo - at), a.as<double>() + (hi - at), out);
      else std::copy(a.as<float>() + (lo - at), a.as<float>() + (hi - at), out);
    }
    at += n;
  }
}

template <class T>
std::vector<T> flatten(const StepParams& sp, std::size_t v, const std::string& tensor, const std::vector<std::string>& names,
                       std::size_t begin, std::size_t end) {
  std::vector<T> out(end - begin);
  flatten_into(out.data(), sp, v, tensor, names, begin, end);
  return out;
}

// How the ranks of a split task see each other's sorted arrays: through memory shared by the ranks
// of a node (each node sorts every variant once, its ranks a share each, and every rank reads the
// sorted windows in place), or, where shared memory is off or too small, by MPI_Alltoallv of the
// sorted windows (each variant sorted once in the whole job, then copied).
struct SortedExchange {
  bool shared = false;
  mpi::Comm node;             // the ranks of this rank's node (shared)
  mpi::SharedWindow window;   // reused by every split task; grown when a task needs more
};

// The partial sums of one tensor (or, with elementwise = false, the sorted part of the whole model)
// computed by this rank alone: every variant sorted, every pair over [0, n).
template <class T>
PairwisePartials whole_partials(const StepParams& sp, const std::string& tensor, const std::vector<std::string>& names,
                                std::size_t n, bool elementwise) {
  const std::size_t V = sp.per_variant.size();
  std::vector<std::vector<T>> values;
  for (std::size_t v = 0; v < V; ++v) values.push_back(flatten<T>(sp, v, tensor, names, 0, n));
  if (elementwise) {
    std::vector<const T*> ptrs;
    for (const auto& x : values) ptrs.push_back(x.data());
    return pairwise_partials(ptrs, n);
  }
  SortedSet<T> set;
  for (auto& x : values) {
    radix_sort(x.data(), n);  // in place: the copy is this function's own
    set.add_sorted(std::move(x));
  }
  PairwisePartials p(V);
  accumulate_sorted(set, 0, n, p);
  return p;
}

// The elementwise partial sums over window w of every variant's unsorted `tensor`.
template <class T>
void add_elementwise_window(const StepParams& sp, const std::string& tensor, const std::vector<std::string>& names,
                            IndexRange w, PairwisePartials& p) {
  std::vector<std::vector<T>> raw;
  std::vector<const T*> ptrs;
  for (std::size_t v = 0; v < sp.per_variant.size(); ++v) {
    raw.push_back(flatten<T>(sp, v, tensor, names, w.begin, w.end));
    ptrs.push_back(raw.back().data());
  }
  accumulate_elementwise(ptrs, w.begin, w.end, p, w.begin);
}

// split_partials through node-shared memory: local rank l of L sorts the variants l, l+L, ... into its
// segment; after publish() every rank reads the sorted windows of every variant in place.
template <class T>
PairwisePartials split_partials_shared(const mpi::Comm& world, SortedExchange& ex, const StepParams& sp,
                                       const std::string& tensor, const std::vector<std::string>& names, std::size_t n,
                                       bool elementwise) {
  const std::size_t V = sp.per_variant.size();
  const std::size_t L = static_cast<std::size_t>(ex.node.size()), l = static_cast<std::size_t>(ex.node.rank());
  const std::size_t mine = V > l ? (V - l + L - 1) / L : 0;  // variants l, l+L, ...
  const std::size_t need = mine * n * sizeof(T);
  const bool grow = !ex.window.valid() || need > ex.window.bytes(ex.node.rank());
  if (ex.node.allreduce_max(static_cast<std::int64_t>(grow)) != 0) {
    ex.window = mpi::SharedWindow();  // free the old one first (collective)
    ex.window = mpi::SharedWindow(ex.node, need);
  }
  T* segment = static_cast<T*>(ex.window.mine());
  for (std::size_t v = l, k = 0; v < V; v += L, ++k) {
    flatten_into(segment + k * n, sp, v, tensor, names, 0, n);
    radix_sort(segment + k * n, n);
  }
  ex.window.publish();
  const IndexRange w = block_aligned_part(n, static_cast<std::size_t>(world.size()), static_cast<std::size_t>(world.rank()));
  SortedSet<T> set;
  for (std::size_t v = 0; v < V; ++v) {
    const T* sorted = static_cast<const T*>(ex.window.segment(static_cast<int>(v % L))) + (v / L) * n;
    set.add_sorted_view(sorted + w.begin, w.end - w.begin, w.begin, n);
  }
  PairwisePartials p(V);
  accumulate_sorted(set, w.begin, w.end, p);
  ex.window.publish();  // every rank of the node has read the segments: the next task may write them
  if (elementwise) add_elementwise_window<T>(sp, tensor, names, w, p);
  return p;
}

// This rank's partial sums of one task computed by every rank of `world` together (collective; the
// caller combines them with allreduce): rank r sorts the variants v = r (mod R) and sends each rank q
// the window q (block_aligned_part) of those sorted arrays (one alltoallv: every rank receives its
// window of every variant, V n / R values); each rank accumulates its window of the sorted positions
// and, with elementwise = true, of the elementwise indices (each variant's unsorted window, copied
// from the parameters it read). Block-aligned windows make the combined sums bit-identical to
// whole_partials() on one process (tests/analysis/test_pairwise_mpi.cpp; tests/cli/test_e2e.cpp).
template <class T>
PairwisePartials split_partials(const mpi::Comm& world, SortedExchange& ex, const StepParams& sp, const std::string& tensor,
                                const std::vector<std::string>& names, std::size_t n, bool elementwise) {
  if (ex.shared) return split_partials_shared<T>(world, ex, sp, tensor, names, n, elementwise);
  const std::size_t V = sp.per_variant.size();
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
      std::vector<T> sorted = flatten<T>(sp, v, tensor, names, 0, n);
      radix_sort(sorted.data(), n);
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
  if (elementwise) add_elementwise_window<T>(sp, tensor, names, w, p);
  return p;
}

std::vector<double> metric_matrices(const PairwiseMatrix& m) {
  const std::size_t V = m.variants;
  std::vector<double> out(kMetrics * V * V, 0.0);
  for (std::size_t i = 0; i < V; ++i)
    for (std::size_t j = 0; j < V; ++j) {
      if (i == j) continue;
      const PairMetrics& p = m.at(i, j);
      const double vals[kMetrics] = {p.w1, p.w2, p.max_abs, p.mean_abs, p.rel_l2};
      for (int k = 0; k < kMetrics; ++k) out[(static_cast<std::size_t>(k) * V + i) * V + j] = vals[k];
    }
  return out;
}

void allreduce(const mpi::Comm& world, PairwisePartials& p) {
  world.allreduce_sum(p.sums(), p.sums_size());
  world.allreduce_max(p.maxima(), p.maxima_size());
}

void write_deviation_h5(const std::string& path, const Plan& plan, const std::vector<std::vector<double>>& results,
                        const Provenance& prov) {
  const std::size_t V = plan.variants.size();
  const std::int64_t v64 = static_cast<std::int64_t>(V);
  atomic_write_sealed_with(path, [&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp, nullptr);
    h5::Group root = f.root();
    root.set_attr("format", std::string("fastudy-deviation/1"));
    root.set_attr("provenance", prov.header());
    root.set_attr("config_hash", prov.config_hash);
    std::string ids, axes, left;
    for (const auto* v : plan.variants) {
      ids += v->id + "\n";
      for (std::size_t a = 0; a < v->axes.size(); ++a) axes += (a ? "," : "") + v->axes[a].first + "=" + v->axes[a].second;
      axes += "\n";
    }
    for (const auto& l : plan.left_out) left += l + "\n";
    root.set_attr("variants", ids);
    root.set_attr("variant_axes", axes);
    root.set_attr("left_out", left);
    h5::Transfer xfer(f);
    h5::Group steps = root.create_group("steps");
    std::size_t task = 0;
    for (auto s : plan.steps) {
      h5::Group sg = steps.create_group(std::to_string(s));
      sg.set_attr("step", static_cast<std::int64_t>(s));
      for (const auto& t : plan.tensors) {
        h5::Group tg = sg.create_group(t);
        const std::vector<double>& m = results[task++];
        for (int k = 0; k < kMetrics; ++k)
          tg.create_dataset(kMetricNames[k], DType::f64, {v64, v64}).write_rows(m.data() + static_cast<std::size_t>(k) * V * V, 0, v64, xfer);
      }
    }
    f.close();
  });
}

// The exchange of split tasks' sorted arrays (see SortedExchange): node-shared memory unless
// FASTUDY_REDUCE_SHARED=0, or unless the shared-memory directory of some node (Open MPI's
// osc_sm_backing_directory, /dev/shm by default) has less room than its ranks need for the largest
// split task (every variant of the whole model, as double when the checkpoints hold fp64). Every rank
// gets the same answer.
SortedExchange sorted_exchange(const mpi::Comm& world, std::size_t V, const std::vector<std::int64_t>& sizes) {
  SortedExchange ex;
  if (world.size() == 1) return ex;
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
    const std::int64_t values = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
    const std::uintmax_t need = static_cast<std::uintmax_t>(values) * V * sizeof(double);  // fp64 at most
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
    return ex;
  }
  ex.shared = true;
  ex.node = std::move(node);
  return ex;
}

double since(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

SourceRole source_role(AxisRole role) {
  switch (role) {
    case AxisRole::optimisation: return SourceRole::optimisation;
    case AxisRole::reference: return SourceRole::reference;
    case AxisRole::noise: return SourceRole::noise;
    case AxisRole::setting: return SourceRole::setting;
  }
  return SourceRole::setting;
}

}  // namespace

void reduce_options(po::options_description& d, CliOptions& o) {
  d.add_options()("allow-missing", po::bool_switch(&o.allow_missing),
                  "leave out variants whose checkpoints are missing or corrupt (reported)");
}

int job_reduce(JobContext& ctx) {
  const Study& st = *ctx.study;
  mpi::Comm& world = *ctx.world;
  const std::string out = ctx.out_dir;
  const auto t_start = std::chrono::steady_clock::now();

  on_root(world, [&] {
    if (!file_exists((fs::path(out) / "study.toml").string()))
      throw UsageError(out + " holds no study (no study.toml)", "run the train phase first, or pass --out DIR");
    reduced_steps(st);  // a [reduce] steps entry that is not a checkpoint step is refused here
  });
  // Every checkpoint is read and checked before any work: rank r checks the variants r, r+R, ...
  std::string checked;
  {
    const std::set<std::int64_t> steps = reduced_steps(st);
    for (std::size_t i = static_cast<std::size_t>(world.rank()); i < st.variants.size();
         i += static_cast<std::size_t>(world.size())) {
      const std::string problem = checkpoints_problem(out, st.variants[i], steps);
      checked += std::to_string(i) + ' ' + problem + '\n';
    }
  }
  const std::vector<std::string> checked_parts = world.gather(checked);
  const auto t_checked = std::chrono::steady_clock::now();
  std::string packed;
  on_root(world, [&] {
    std::vector<std::string> problems(st.variants.size());
    for (const auto& part : checked_parts) {
      std::istringstream in(part);
      std::string line;
      while (std::getline(in, line)) {
        const auto sp = line.find(' ');
        problems.at(std::stoul(line.substr(0, sp))) = line.substr(sp + 1);
      }
    }
    packed = pack_plan(make_plan(st, out, ctx.opts.allow_missing, problems));
  });
  world.bcast(packed);
  const Plan plan = unpack_plan(packed, st);
  const std::size_t V = plan.variants.size();
  const std::size_t T = plan.tensors.size();
  const std::size_t tasks = plan.steps.size() * T;
  log::info("reduce: " + std::to_string(V) + " variants x " + std::to_string(plan.steps.size()) + " steps x " +
            std::to_string(T - 1) + " tensors (+ whole model) on " + std::to_string(world.size()) + " rank(s)");

  // Task k = (step k / T, tensor k % T): a split task (the whole model, a tensor of at least
  // kSplitElements values, with more than one rank) runs on every rank; the others are dealt by size
  // (the plan's, from the first variant's checkpoint: every variant has the same parameters).
  std::vector<bool> split(T, false);
  std::vector<std::int64_t> sizes(plan.sizes);
  sizes.push_back(0);  // the whole model: always split on several ranks
  for (std::size_t t = 0; t < T; ++t)
    split[t] = world.size() > 1 && (t + 1 == T || static_cast<std::size_t>(sizes[t]) >= kSplitElements);
  // The unsplit tasks by cost (their size: the pairwise work is linear in it), largest first, each to
  // the rank with the least work so far (longest processing time first; ties: the lowest rank). The
  // same on every rank: the plan was broadcast.
  std::vector<int> owner(tasks, -1);  // -1: every rank
  {
    std::vector<std::size_t> order;
    for (std::size_t k = 0; k < tasks; ++k)
      if (!split[k % T]) order.push_back(k);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return sizes[a % T] > sizes[b % T]; });
    std::vector<std::int64_t> load(static_cast<std::size_t>(world.size()), 0);
    for (std::size_t k : order) {
      const auto least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      owner[k] = least;
      load[static_cast<std::size_t>(least)] += std::max<std::int64_t>(sizes[k % T], 1);
    }
  }
  std::string mine;
  std::vector<std::string> names(plan.tensors.begin(), plan.tensors.end() - 1);
  SortedExchange exchange = sorted_exchange(world, V, plan.sizes);
  const auto model_values = static_cast<std::size_t>(std::accumulate(plan.sizes.begin(), plan.sizes.end(), std::int64_t{0}));
  // A stop signal (SIGTERM, SIGUSR1) ends the work at the next task; nothing is written. The ranks
  // agree on it before each split task (a collective), so none waits for another in vain.
  bool stopped = false;
  double read_s = 0, compute_s = 0;  // this rank's time reading checkpoints and computing (debug log)
  for (std::size_t si = 0; si < plan.steps.size() && !stopped; ++si) {
    bool any = false;
    for (std::size_t t = 0; t < T; ++t) any |= owner[si * T + t] < 0 || owner[si * T + t] == world.rank();
    if (!any) continue;
    auto t0 = std::chrono::steady_clock::now();
    StepParams sp;
    sp.per_variant = read_step_params(plan, out, plan.steps[si]);
    for (const auto& arrays : sp.per_variant)
      for (const auto& a : arrays) sp.f64 |= a.dtype == DType::f64;
    auto t1 = std::chrono::steady_clock::now();
    read_s += since(t0, t1);
    // The whole model's elementwise sums are those of its tensors added up (combine_elementwise): this
    // rank's share (its own tasks, its windows of split tasks) is added here and combined over the
    // ranks with the model's sorted sums, so the model needs no elementwise pass of its own.
    PairwisePartials model_elementwise(V);
    for (std::size_t t = 0; t < T && !stopped; ++t) {
      const std::size_t k = si * T + t;
      const bool model = t + 1 == T, split_task = owner[k] < 0;
      const std::size_t n = model ? model_values : static_cast<std::size_t>(plan.sizes[t]);
      PairwisePartials p;  // this rank's part of the task (all of it for an unsplit task)
      if (split_task) {
        if (world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) {
          stopped = true;
          break;
        }
        p = sp.f64 ? split_partials<double>(world, exchange, sp, plan.tensors[t], names, n, !model)
                   : split_partials<float>(world, exchange, sp, plan.tensors[t], names, n, !model);
      } else {
        // A signal skips this rank's own tasks; it leaves the loop only at the next collective check,
        // together with the other ranks (the check after the loop then fails the job everywhere).
        if (owner[k] != world.rank() || stop_signal_received()) continue;
        p = sp.f64 ? whole_partials<double>(sp, plan.tensors[t], names, n, !model)
                   : whole_partials<float>(sp, plan.tensors[t], names, n, !model);
      }
      if (model) p.combine_elementwise(model_elementwise);
      else model_elementwise.combine_elementwise(p);
      if (split_task) {
        allreduce(world, p);
        p.set_has_w2(true);
        if (!world.is_root()) continue;  // rank 0 holds the result
      }
      const std::vector<double> m = metric_matrices(p.finalize());
      const std::uint64_t idx = k;
      mine.append(reinterpret_cast<const char*>(&idx), sizeof idx);
      mine.append(reinterpret_cast<const char*>(m.data()), m.size() * sizeof(double));
    }
    compute_s += since(t1, std::chrono::steady_clock::now());
  }
  const auto t_computed = std::chrono::steady_clock::now();
  std::vector<std::string> parts = world.gather(mine);
  if (world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) {
    log::warn("reduce: stopped by a signal; nothing was written, run it again to redo it");
    return kExitFailure;
  }

  const auto t_gathered = std::chrono::steady_clock::now();
  on_root(world, [&] {
    const std::size_t task_bytes = sizeof(std::uint64_t) + kMetrics * V * V * sizeof(double);
    std::vector<std::vector<double>> results(tasks);
    for (const auto& part : parts) {
      for (std::size_t off = 0; off + task_bytes <= part.size(); off += task_bytes) {
        std::uint64_t idx;
        std::memcpy(&idx, part.data() + off, sizeof idx);
        results[idx].resize(kMetrics * V * V);
        std::memcpy(results[idx].data(), part.data() + off + sizeof idx, kMetrics * V * V * sizeof(double));
      }
    }
    for (std::size_t k = 0; k < tasks; ++k)
      if (results[k].empty()) throw Error("reduce: task " + std::to_string(k) + " produced no result");

    // deviation.csv
    std::ostringstream csv;
    csv << ctx.prov.header() << "step,tensor,variant_a,variant_b,w1,w2,max_abs,mean_abs,rel_l2\n";
    for (std::size_t si = 0; si < plan.steps.size(); ++si)
      for (std::size_t t = 0; t < T; ++t) {
        const auto& m = results[si * T + t];
        for (std::size_t i = 0; i < V; ++i)
          for (std::size_t j = i + 1; j < V; ++j) {
            csv << plan.steps[si] << ',' << plan.tensors[t] << ',' << plan.variants[i]->id << ',' << plan.variants[j]->id;
            for (int k = 0; k < kMetrics; ++k) csv << ',' << number_text(m[(static_cast<std::size_t>(k) * V + i) * V + j]);
            csv << '\n';
          }
      }
    write_deviation_h5((fs::path(out) / "deviation.h5").string(), plan, results, ctx.prov);
    atomic_write_sealed((fs::path(out) / "deviation.csv").string(), csv.str());
    const auto t_written = std::chrono::steady_clock::now();

    // The ranking, on the whole-model matrices.
    std::vector<RankingVariant> rv;
    for (const auto* v : plan.variants) rv.push_back({v->id, v->axes});
    std::vector<StepMatrices> sm;
    for (std::size_t si = 0; si < plan.steps.size(); ++si) {
      const auto& m = results[si * T + (T - 1)];
      StepMatrices s;
      s.step = plan.steps[si];
      s.w1.assign(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(V * V));
      s.max_abs.assign(m.begin() + static_cast<std::ptrdiff_t>(2 * V * V), m.begin() + static_cast<std::ptrdiff_t>(3 * V * V));
      sm.push_back(std::move(s));
    }
    // Each axis's role, baseline and replicate flag from the axis table (src/core/config.cpp).
    std::vector<RankingAxis> axes;
    for (const auto& [name, values] : st.axes) {
      RankingAxis a{name, values, SourceRole::setting, "", false};
      if (const GridAxisInfo* info = find_grid_axis(name)) {
        a.role = source_role(info->role);
        a.baseline = info->baseline;
        a.replicate = info->replicate;
      }
      axes.push_back(std::move(a));
    }
    Ranking ranking = rank_deviation_sources(axes, rv, sm);
    for (const auto& l : plan.left_out) ranking.notes.push_back("left out " + l);
    std::ostringstream ax;
    ax << ctx.prov.header() << "axis,role,baseline,replicate,values\n";
    for (const auto& a : axes) {
      ax << a.name << ',' << source_role_name(a.role) << ',' << (a.baseline.empty() ? a.values.front() : a.baseline)
         << ',' << (a.replicate ? 1 : 0) << ',';
      for (std::size_t k = 0; k < a.values.size(); ++k) ax << (k ? ";" : "") << a.values[k];
      ax << '\n';
    }
    atomic_write_sealed((fs::path(out) / "axes.csv").string(), ax.str());
    std::ostringstream rc;
    rc << ctx.prov.header()
       << "axis,role,condition,value_a,value_b,pairs,independent,step,w1_mean,w1_min,w1_max,max_abs_mean,slope\n";
    for (const auto& r : ranking.rows)
      rc << r.axis << ',' << source_role_name(r.role) << ',' << r.condition << ',' << r.value_a << ',' << r.value_b << ','
         << r.pairs << ',' << r.independent << ',' << r.step << ',' << number_text(r.w1_mean) << ','
         << number_text(r.w1_min) << ',' << number_text(r.w1_max) << ',' << number_text(r.max_abs_mean) << ','
         << number_text(r.slope) << '\n';
    for (const auto& n : ranking.notes) rc << "# note: " << n << '\n';
    atomic_write_sealed((fs::path(out) / "ranking.csv").string(), rc.str());
    std::ostringstream vc;
    vc << ctx.prov.header()
       << "axis,baseline,value,condition,reference,reference_pair,pairs,independent,reference_pairs,"
          "reference_independent,step,w1,reference_w1,end_ratio,end_lo,end_hi,slope,reference_slope,slope_ratio,"
          "slope_lo,slope_hi,informative,noise_w1,measure,comparison,verdict\n";
    for (const auto& c : ranking.comparisons)
      vc << c.axis << ',' << c.baseline << ',' << c.value << ',' << c.condition << ',' << c.reference << ','
         << c.reference_pair << ',' << c.pairs << ',' << c.independent << ',' << c.reference_pairs << ','
         << c.reference_independent << ',' << c.step << ',' << number_text(c.w1) << ',' << number_text(c.reference_w1)
         << ',' << number_text(c.end_ratio) << ',' << number_text(c.end_lo) << ',' << number_text(c.end_hi) << ','
         << number_text(c.slope) << ',' << number_text(c.reference_slope) << ',' << number_text(c.slope_ratio) << ','
         << number_text(c.slope_lo) << ',' << number_text(c.slope_hi) << ',' << (c.informative ? 1 : 0) << ','
         << number_text(c.noise_w1) << ',' << c.measure << ',' << c.comparison << ',' << c.verdict << '\n';
    atomic_write_sealed((fs::path(out) / "verdict.csv").string(), vc.str());
    std::ostringstream tw;
    tw << ctx.prov.header() << "variant,twin,precision,step,w1,max_abs\n";
    for (const auto& t : ranking.twins)
      tw << t.variant << ',' << t.twin << ',' << t.precision << ',' << t.step << ',' << number_text(t.w1) << ',' << number_text(t.max_abs) << '\n';
    atomic_write_sealed((fs::path(out) / "twins.csv").string(), tw.str());
    log::info(format_ranking_table(ranking));
    const auto t_end = std::chrono::steady_clock::now();
    log::debug("reduce: rank 0 checked checkpoints for " + number_text(since(t_start, t_checked)) + " s, read them for " +
               number_text(read_s) + " s, computed for " + number_text(compute_s) + " s, gathered for " +
               number_text(since(t_computed, t_gathered)) + " s, wrote deviation.h5/.csv for " +
               number_text(since(t_gathered, t_written)) + " s, ranked and wrote the rest for " +
               number_text(since(t_written, t_end)) + " s");
    log::info("reduce: wrote deviation.h5, deviation.csv, axes.csv, ranking.csv, verdict.csv and twins.csv in " + out);
  });
  return kExitOk;
}

}  // namespace fastudy
