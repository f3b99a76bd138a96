// `fastudy reduce GRID.toml|OUT`: how far apart did the variants' weights drift, and which grid axis
// moved them most. Reads the checkpoints, computes for every checkpoint step the pairwise matrices
// (W1, W2, max |d|, mean |d|, relative L2) per tensor and for the whole model (all parameters
// flattened), and ranks the axes as deviation sources (analysis/ranking.hpp).
//
// Work split: the tasks are (step, tensor) pairs plus one whole-model task per step. Small tensors are
// dealt to the ranks by size (largest first, to the least loaded: src/runtime/deal.hpp) and computed
// whole by one rank. The whole model and every tensor of at least kSplitElements values are split over
// all ranks by element range (analysis/sorted_exchange.hpp): the variants are sorted once, the sorted
// arrays are exchanged, and every rank accumulates its block-aligned part of the sorted positions (and
// of the elementwise indices); the exact partial sums are combined with MPI_Allreduce. The whole
// model's elementwise sums (max |d|, mean |d|, relative L2) are those of its tensors added up
// (PairwisePartials::combine_elementwise), so it needs only the sorted pass of its own. Block-aligned
// splits give bit-identical sums, so the results do not depend on the number of ranks either way.
// Rank 0 gathers them in task order and writes deviation.h5/.csv, axes.csv, ranking.csv, verdict.csv
// and twins.csv (jobs/reduce_output.hpp).
//
// An imported study ([import]) takes its runs from files other programs wrote: every file is checked
// first (jobs/reduce_import.hpp; bad input is an exit 2 before any distance), the study folder is made
// when this is its first phase, imported.csv records the files, and the tasks read their values by
// range from the files (src/io/import_runs.hpp) instead of from fastudy's checkpoints.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include <boost/program_options.hpp>

#include "analysis/distance.hpp"
#include "analysis/ranking.hpp"
#include "analysis/sorted_exchange.hpp"
#include "base/bytes.hpp"
#include "base/log.hpp"
#include "base/manifest.hpp"
#include "base/number.hpp"
#include "base/progress.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "jobs/preflight.hpp"
#include "jobs/reduce_import.hpp"
#include "jobs/reduce_output.hpp"
#include "src/io/checkpoint.hpp"
#include "src/runtime/deal.hpp"
#include "src/runtime/mpi.hpp"

namespace fs = std::filesystem;

namespace po = boost::program_options;

namespace fastudy {

namespace {

// The checkpoint steps reduce reads: [reduce] steps, or every checkpoint step (checkpoint_schedule;
// throws UsageError for a listed step that is not a checkpoint step).
std::set<std::int64_t> reduced_steps(const Study& st) {
  const std::vector<std::int64_t> schedule = checkpoint_schedule(st.train.checkpoint_every, st.train.steps);
  std::set<std::int64_t> expected(schedule.begin(), schedule.end());
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

// The first problem of variant v's checkpoints at `steps` ("" when they are all there, intact, and
// v's checkpoints of those steps trained with v's configuration: CheckpointIdentity).
std::string checkpoints_problem(const std::string& out, const Variant& v, const std::set<std::int64_t>& steps) {
  for (auto s : steps) {
    const std::string path = checkpoint_path(out, v.id, s);
    if (!fs::exists(path)) return path + " is missing";
    const CheckpointIdentity want{v.id, s, v.hash};
    if (auto p = checkpoint_problem(path, &want)) return *p;
  }
  return {};
}

// Rank 0: which variants and steps to reduce, from every variant's checkpoint problem (checked by all
// ranks, a share each); missing or corrupt checkpoints are errors naming the file unless
// --allow-missing, which leaves the variant out.
ReducePlan make_plan(const Study& st, const std::string& out, bool allow_missing, const std::vector<std::string>& problems) {
  ReducePlan plan;
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
  plan.tensors.push_back(kModelTensor);
  return plan;
}

std::string pack_plan(const ReducePlan& p) {
  std::ostringstream os;
  for (const auto* v : p.variants) os << "v " << v->id << '\n';
  for (const auto& s : p.left_out) os << "l " << s << '\n';
  for (auto s : p.steps) os << "s " << s << '\n';
  for (const auto& t : p.tensors) os << "t " << t << '\n';
  for (auto n : p.sizes) os << "n " << n << '\n';
  return os.str();
}

ReducePlan unpack_plan(const std::string& text, const Study& st) {
  ReducePlan p;
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

// Parameters of every variant at one step, as double when any variant stores f64, else float: read
// whole (checkpoints), or, in an imported study, read by range as they are asked for (imported).
struct StepParams {
  bool f64 = false;
  std::vector<std::vector<NamedArray>> per_variant;
  std::unique_ptr<io::ImportedStep> imported;
};

// Every variant's parameters at one step. Every rank reads them all (from the page cache that is
// cheaper than reading a share and exchanging the arrays: 0.27 s to read 12 checkpoints of 3.3M
// parameters, 0.8 s to pack and allgather half of them), without the whole-file pass: the check
// before the work verified every file against its sidecar (the crc32 of each dataset is checked).
std::vector<std::vector<NamedArray>> read_step_params(const ReducePlan& plan, const std::string& out, std::int64_t step) {
  std::vector<std::vector<NamedArray>> arrays;
  for (const auto* v : plan.variants)
    arrays.push_back(read_params(checkpoint_path(out, v->id, step), {}, WholeFile::checked_before));
  return arrays;
}

// Values [begin, end) of variant v's `tensor` (kModelTensor: all parameters concatenated in file order),
// converted to T, into dst (end - begin values). Copies only that range.
template <class T>
void flatten_into(T* dst, const StepParams& sp, std::size_t v, const std::string& tensor,
                  const std::vector<std::string>& names, std::size_t begin, std::size_t end) {
  const std::vector<NamedArray>& arrays = sp.per_variant[v];
  std::size_t at = 0;  // index of the current tensor's first value in the (concatenated) tensor
  for (std::size_t t = 0; t < arrays.size() && at < end; ++t) {
    if (tensor != kModelTensor && names[t] != tensor) continue;
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

// The values of `tensor` at one step, for analysis/sorted_exchange.hpp: from the checkpoints read for
// the step (sp.per_variant), or, in an imported study, read by range from the variant's file as they
// are asked for (sp.imported: every rank reads only what its tasks and windows need; the check before
// the work verified every file).
template <class T>
VariantValues<T> values_of(const StepParams& sp, const std::string& tensor, const std::vector<std::string>& names,
                           const ReducePlan& plan) {
  if (!sp.imported)
    return [&sp, &tensor, &names](std::size_t v, std::size_t begin, std::size_t end, T* dst) {
      flatten_into(dst, sp, v, tensor, names, begin, end);
    };
  std::vector<std::string> which = names;
  std::vector<std::int64_t> sizes(plan.sizes);
  if (tensor != kModelTensor) {
    const auto t = static_cast<std::size_t>(std::find(names.begin(), names.end(), tensor) - names.begin());
    which = {tensor};
    sizes = {plan.sizes.at(t)};
  }
  io::ImportedStep* step = sp.imported.get();
  return [step, which, sizes](std::size_t v, std::size_t begin, std::size_t end, T* dst) {
    step->read(v, which, sizes, begin, end, dst);
  };
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

// Rank 0: the output directory holds a study, and every [reduce] steps entry is a checkpoint step.
void check_study_dir(const Study& st, const std::string& out) {
  if (!file_exists((fs::path(out) / "study.toml").string()))
    throw UsageError(out + " holds no study (no study.toml)", "run the train phase first, or pass --out DIR");
  reduced_steps(st);
}

// Collective: every checkpoint is read and checked before any work (rank r checks the variants r,
// r+R, ...), rank 0 makes the plan from the problems found (make_plan) and every rank gets it.
ReducePlan agree_on_plan(const Study& st, const std::string& out, bool allow_missing, mpi::Comm& world) {
  std::string checked;
  const std::set<std::int64_t> steps = reduced_steps(st);
  for (std::size_t i = static_cast<std::size_t>(world.rank()); i < st.variants.size();
       i += static_cast<std::size_t>(world.size())) {
    const std::string problem = checkpoints_problem(out, st.variants[i], steps);
    checked += std::to_string(i) + ' ' + problem + '\n';
  }
  const std::vector<std::string> checked_parts = world.gather(checked);
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
    packed = pack_plan(make_plan(st, out, allow_missing, problems));
  });
  world.bcast(packed);
  return unpack_plan(packed, st);
}

// The owner of every task k = (step k / T, tensor k % T): -1 for a split task (the whole model, or a
// tensor of at least kSplitElements values, with more than one rank), which runs on every rank; the
// others dealt by size (deal_largest_first; the pairwise work is linear in it), from the plan's sizes
// (the first variant's checkpoint: every variant has the same parameters). The same on every rank.
std::vector<int> task_owners(const ReducePlan& plan, int ranks) {
  const std::size_t T = plan.tensors.size(), tasks = plan.steps.size() * T;
  std::vector<std::int64_t> sizes(plan.sizes);
  sizes.push_back(0);  // the whole model: always split on several ranks
  std::vector<bool> split(T, false);
  for (std::size_t t = 0; t < T; ++t)
    split[t] = ranks > 1 && (t + 1 == T || static_cast<std::size_t>(sizes[t]) >= kSplitElements);
  std::vector<std::size_t> dealt;
  std::vector<double> costs;
  for (std::size_t k = 0; k < tasks; ++k)
    if (!split[k % T]) {
      dealt.push_back(k);
      costs.push_back(static_cast<double>(std::max<std::int64_t>(sizes[k % T], 1)));
    }
  std::vector<int> owner(tasks, -1);
  const std::vector<int> ranks_of = deal_largest_first(costs, ranks);
  for (std::size_t i = 0; i < dealt.size(); ++i) owner[dealt[i]] = ranks_of[i];
  return owner;
}

// The V x V matrices of every metric (kMetrics, metric-major) of finalized partials.
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

// This rank's work: its own tasks and its part of every split task. The results it holds (its own
// tasks; on rank 0 also the split ones) go to `results` as bytes: per task its index, then its
// metric_matrices. `stopped` when a stop signal ended the work.
struct RankWork {
  ByteWriter results;
  bool stopped = false;
  double read_s = 0, compute_s = 0;  // reading checkpoints and computing (debug log)
};

RankWork compute_tasks(const Study& st, const ReducePlan& plan, const std::vector<int>& owner, const std::string& out,
                       mpi::Comm& world) {
  const std::size_t V = plan.variants.size(), T = plan.tensors.size();
  const std::vector<std::string> names(plan.tensors.begin(), plan.tensors.end() - 1);
  const auto model_values = static_cast<std::size_t>(std::accumulate(plan.sizes.begin(), plan.sizes.end(), std::int64_t{0}));
  SortedExchange exchange(world, V, model_values);
  RankWork work;
  // This rank's work on the console (rank 0; the deal balances the ranks): tasks done, the speed, and
  // the time left from the values still to sort at the values per second measured so far.
  auto values_of_task = [&](std::size_t k) {
    const std::size_t t = k % T;
    return t + 1 == T ? static_cast<double>(model_values) : static_cast<double>(plan.sizes[t]);
  };
  double mine_values = 0, done_values = 0;
  std::size_t mine_tasks = 0, done_tasks = 0;
  for (std::size_t k = 0; k < owner.size(); ++k)
    if (owner[k] < 0 || owner[k] == world.rank()) mine_values += values_of_task(k), ++mine_tasks;
  ProgressLine progress;
  const auto start = std::chrono::steady_clock::now();
  auto task_done = [&](std::size_t k) {
    done_values += values_of_task(k);
    ++done_tasks;
    const double s = since(start, std::chrono::steady_clock::now());
    progress.update("reduce: " + std::to_string(done_tasks) + "/" + std::to_string(mine_tasks) +
                    " tasks (step x tensor), " + rate_text(static_cast<double>(done_tasks) / s) + " tasks/s, " +
                    eta_text(s * (mine_values - done_values) / done_values));
  };
  for (std::size_t si = 0; si < plan.steps.size() && !work.stopped; ++si) {
    bool any = false;
    for (std::size_t t = 0; t < T; ++t) any |= owner[si * T + t] < 0 || owner[si * T + t] == world.rank();
    if (!any) continue;
    auto t0 = std::chrono::steady_clock::now();
    StepParams sp;
    if (plan.files.empty()) {
      sp.per_variant = read_step_params(plan, out, plan.steps[si]);
      for (const auto& arrays : sp.per_variant)
        for (const auto& a : arrays) sp.f64 |= a.dtype == DType::f64;
    } else {
      sp.f64 = plan.f64;
      std::vector<std::string> paths;
      for (const auto& files : plan.files) paths.push_back(files[si]);
      sp.imported = std::make_unique<io::ImportedStep>(st.import, std::move(paths));
    }
    auto t1 = std::chrono::steady_clock::now();
    work.read_s += since(t0, t1);
    // The whole model's elementwise sums are those of its tensors added up (combine_elementwise): this
    // rank's share (its own tasks, its windows of split tasks) is added here and combined over the
    // ranks with the model's sorted sums, so the model needs no elementwise pass of its own.
    PairwisePartials model_elementwise(V);
    for (std::size_t t = 0; t < T && !work.stopped; ++t) {
      const std::size_t k = si * T + t;
      const bool model = t + 1 == T, split_task = owner[k] < 0;
      const std::size_t n = model ? model_values : static_cast<std::size_t>(plan.sizes[t]);
      const std::string& tensor = plan.tensors[t];
      PairwisePartials p;  // this rank's part of the task (all of it for an unsplit task)
      if (split_task) {
        if (world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) {
          work.stopped = true;
          break;
        }
        p = sp.f64 ? exchange.split_partials<double>(world, V, n, values_of<double>(sp, tensor, names, plan), !model)
                   : exchange.split_partials<float>(world, V, n, values_of<float>(sp, tensor, names, plan), !model);
      } else {
        // A signal skips this rank's own tasks; it leaves the loop only at the next collective check,
        // together with the other ranks (the check after the loop then fails the job everywhere).
        if (owner[k] != world.rank() || stop_signal_received()) continue;
        p = sp.f64 ? local_partials<double>(V, n, values_of<double>(sp, tensor, names, plan), !model)
                   : local_partials<float>(V, n, values_of<float>(sp, tensor, names, plan), !model);
      }
      if (model) p.combine_elementwise(model_elementwise);
      else model_elementwise.combine_elementwise(p);
      if (split_task) {
        allreduce_partials(world, p);
        p.set_has_w2(true);
        if (!world.is_root()) continue;  // rank 0 holds the result
      }
      task_done(k);
      const std::vector<double> m = metric_matrices(p.finalize());
      work.results.put<std::uint64_t>(k);
      work.results.put_bytes(m.data(), m.size() * sizeof(double));
    }
    work.compute_s += since(t1, std::chrono::steady_clock::now());
  }
  progress.finish();
  return work;
}

// Rank 0: every task's result from the ranks' bytes (RankWork::results), in task order.
TaskResults collect_results(const ReducePlan& plan, const std::vector<std::string>& parts) {
  const std::size_t V = plan.variants.size(), tasks = plan.steps.size() * plan.tensors.size();
  TaskResults results(tasks);
  for (const auto& part : parts) {
    ByteReader in(part, "reduce: the results a rank sent");
    while (!in.done()) {
      const auto k = in.get<std::uint64_t>();
      if (k >= tasks) throw Error("reduce: a rank sent the result of task " + std::to_string(k) + " of " + std::to_string(tasks));
      results[k].resize(kMetrics * V * V);
      in.get_bytes(results[k].data(), results[k].size() * sizeof(double));
    }
  }
  for (std::size_t k = 0; k < tasks; ++k)
    if (results[k].empty()) throw Error("reduce: task " + std::to_string(k) + " produced no result");
  return results;
}

// Each grid axis with its role, baseline and replicate flag: the study's [axes.NAME], else the axis
// table (kGridAxes, src/core/grid.cpp), else a setting (study_axis).
std::vector<RankingAxis> ranking_axes(const Study& st) {
  std::vector<RankingAxis> axes;
  for (const auto& [name, values] : st.axes) {
    const GridAxisInfo info = study_axis(st, name);
    axes.push_back(RankingAxis{name, values, source_role(info.role), info.baseline, info.replicate});
  }
  return axes;
}

// The ranking of the axes on the whole-model matrices (W1 and max |d| of every step); the left-out
// variants become notes.
Ranking rank_axes(const ReducePlan& plan, const TaskResults& results, const std::vector<RankingAxis>& axes) {
  const std::size_t V = plan.variants.size(), T = plan.tensors.size();
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
  Ranking ranking = rank_deviation_sources(axes, rv, sm);
  for (const auto& l : plan.left_out) ranking.notes.push_back("left out " + l);
  return ranking;
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
  const auto path = [&](const char* name) { return (fs::path(out) / name).string(); };
  const auto t_start = std::chrono::steady_clock::now();

  ReducePlan plan;
  if (st.imported()) {
    // Every file checked before anything is written; the study folder is made (the first phase of an
    // imported study) or continued, and the files' provenance recorded.
    ImportCheck check = check_imports(st, &world);
    plan = std::move(check.plan);
    on_root(world, [&] {
      check_output_space(out, static_cast<double>(reduce_output_bytes(plan)), "the reduce's results (deviation.h5, deviation.csv, ...)");
      if (!file_exists(path("study.toml")) || ctx.opts.command == "run") prepare_output(ctx);
      manifest::add(out, {{manifest::Kind::file, "reduce", "imported.csv"}});
      write_imported_csv(out, check.records, ctx.prov);
    });
  } else {
    on_root(world, [&] { check_study_dir(st, out); });
    plan = agree_on_plan(st, out, ctx.opts.allow_missing, world);
    on_root(world, [&] {
      check_output_space(out, static_cast<double>(reduce_output_bytes(plan)), "the reduce's results (deviation.h5, deviation.csv, ...)");
    });
  }
  const auto t_checked = std::chrono::steady_clock::now();
  log::info("reduce: " + std::to_string(plan.variants.size()) + " variants x " + std::to_string(plan.steps.size()) +
            " steps x " + std::to_string(plan.tensors.size() - 1) + " tensors (+ whole model) on " +
            std::to_string(world.size()) + " rank(s)");

  const RankWork work = compute_tasks(st, plan, task_owners(plan, world.size()), out, world);
  const auto t_computed = std::chrono::steady_clock::now();
  const std::vector<std::string> parts = world.gather(work.results.bytes());
  if (world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) {
    log::warn("reduce: stopped by a signal; nothing was written, run it again to redo it");
    return kExitFailure;
  }
  const auto t_gathered = std::chrono::steady_clock::now();

  on_root(world, [&] {
    const TaskResults results = collect_results(plan, parts);
    write_deviation_h5(path("deviation.h5"), plan, results, ctx.prov);
    write_deviation_csv(path("deviation.csv"), plan, results, ctx.prov);
    const auto t_written = std::chrono::steady_clock::now();
    const std::vector<RankingAxis> axes = ranking_axes(st);
    const Ranking ranking = rank_axes(plan, results, axes);
    write_axes_csv(path("axes.csv"), axes, ctx.prov);
    write_ranking_csv(path("ranking.csv"), ranking, ctx.prov);
    write_verdict_csv(path("verdict.csv"), ranking, ctx.prov);
    write_twins_csv(path("twins.csv"), ranking, ctx.prov);
    log::info(format_ranking_table(ranking));
    const auto t_end = std::chrono::steady_clock::now();
    log::debug("reduce: rank 0 checked checkpoints for " + number_text(since(t_start, t_checked)) + " s, read them for " +
               number_text(work.read_s) + " s, computed for " + number_text(work.compute_s) + " s, gathered for " +
               number_text(since(t_computed, t_gathered)) + " s, wrote deviation.h5/.csv for " +
               number_text(since(t_gathered, t_written)) + " s, ranked and wrote the rest for " +
               number_text(since(t_written, t_end)) + " s");
    log::info("reduce: wrote deviation.h5, deviation.csv, axes.csv, ranking.csv, verdict.csv and twins.csv in " + out);
  });
  return kExitOk;
}

}  // namespace fastudy
