// `fastudy plan GRID.toml --ranks N`: the variants, how N ranks split into groups, where they train
// and which gradient reducer each group gets (--gpus-per-node G, --ranks-per-node R model a cluster;
// by default this machine), and estimates of parameters, checkpoint bytes, memory per rank and the
// train phase's time. Writes nothing. Under `mpirun -n N` it runs once and plans for N ranks.
//
// Time: the variants that differ only in replicate axes (seed, repeat) cost the same per step, so one
// variant of each kind is trained here for --measure-steps steps (after one warm-up step) and timed;
// a variant takes steps x its kind's step time / ranks_per_variant, and the scheduler's dynamic
// assignment (each variant, in grid order, to the group that becomes free first) gives the phase's
// time. Steps are timed on the LibTorch threads each of the N ranks would get on this machine by
// default (default_rank_threads: its CPUs shared by N, at least 1), and every rank is assumed to have
// as many CPUs as fast as this machine's; checkpoint writes, the other phases and start-up are not
// counted. A grid whose training step would need more than half of this machine's memory (or whose
// step fails here) is not timed; plan says so.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <boost/program_options.hpp>

#include "base/error.hpp"
#include "base/log.hpp"
#include "jobs/estimate.hpp"
#include "jobs/job.hpp"
#include "jobs/preflight.hpp"
#include "jobs/reduce_import.hpp"
#include "jobs/reduce_work.hpp"
#include "src/runtime/gpu.hpp"
#include "src/runtime/mpi.hpp"
#include "src/runtime/placement.hpp"
#include "src/runtime/reducer.hpp"
#include "src/train/trainer.hpp"

namespace po = boost::program_options;

namespace fastudy {

namespace {

// A notifier for an integer option: UsageError (exit 2, before anything runs) below `least`.
std::function<void(int)> at_least(const char* option, int least) {
  return [option, least](int v) {
    if (v < least)
      throw UsageError(std::string(option) + " must be >= " + std::to_string(least) + " (got " + std::to_string(v) + ")",
                       "see `fastudy plan --help`");
  };
}

}  // namespace

void plan_options(po::options_description& d, CliOptions& o) {
  d.add_options()("ranks,n", po::value<int>(&o.plan.ranks)->notifier(at_least("--ranks", 1)),
                  "number of MPI ranks to plan for (default: the ranks plan runs on: 1, or N under mpirun -n N)")(
      "gpus-per-node", po::value<int>(&o.plan.gpus_per_node)->notifier(at_least("--gpus-per-node", 0)),
      "plan for nodes with this many GPUs each and a CUDA build with NCCL (default: the GPUs this build sees "
      "here); decides each group's device and gradient reducer")(
      "ranks-per-node", po::value<int>(&o.plan.ranks_per_node)->notifier(at_least("--ranks-per-node", 1)),
      "ranks on each node, consecutive ranks together (default: every rank on one node)")(
      "measure-steps", po::value<int>(&o.plan.measure_steps)->default_value(3),
      "timed training steps per kind of variant for the time estimate (after one warm-up step; 0: no estimate)");
}

namespace {

std::string duration_text(double s) {
  char buf[96];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.3g s", s);  // 3 digits: a small study's 0.0234 s is not "0.0 s"
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0f s (%.0f min %.0f s)", s, std::floor(s / 60), std::fmod(s, 60));
  else std::snprintf(buf, sizeof buf, "%.0f s (%.1f h)", s, s / 3600);
  return buf;
}

// The train phase's time on `groups` groups of `rpv` ranks (see the top of this file).
std::string time_estimate(const Study& st, int groups, int rpv, int measure_steps) {
  std::map<std::string, double> step_s;  // kind (the variant's non-replicate axis values) -> s/step
  std::vector<std::string> kinds;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> per_variant;
  // Each rank's LibTorch threads when all groups*rpv ranks run on this machine (the run's default).
  const int threads = default_rank_threads(groups * rpv);
  for (const Variant& v : st.variants) {
    const std::string kind = variant_kind(v);
    if (!step_s.count(kind)) {
      // The measuring process runs a whole global batch: memory about ranks_per_variant times a rank's.
      const double need = estimate_variant(v).memory_per_rank * rpv, have = host_memory_limit();
      if (have > 0 && need > 0.5 * have)
        return "time estimate: not measured: a training step of " + v.id + " needs about " + human_bytes(need) +
               ", more than half of this machine's " + human_bytes(have) + "\n";
      try {
        step_s[kind] = measure_step_seconds(v, 1, measure_steps, threads);
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));
        return "time estimate: not measured: a training step of " + v.id + " failed here (" + what + ")\n";
      }
      kinds.push_back(kind);
    }
    per_variant.push_back(static_cast<double>(v.train.steps) * step_s[kind] / rpv);
  }
  const double measuring = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> free_at(static_cast<std::size_t>(groups), 0.0);
  for (double t : per_variant) *std::min_element(free_at.begin(), free_at.end()) += t;
  const double phase = *std::max_element(free_at.begin(), free_at.end());
  std::ostringstream os;
  os << "time estimate, train phase: " << duration_text(phase) << " on " << groups * rpv << " rank"
     << (groups * rpv == 1 ? "" : "s") << " (step times measured here on " << threads << " thread"
     << (threads == 1 ? "" : "s") << " per rank, this machine's share for each of the ranks, "
     << measure_steps << " timed steps after a warm-up per kind of variant, " << duration_text(measuring)
     << "; checkpoint writes and the other phases not counted):\n";
  for (const auto& k : kinds) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.3g", 1e3 * step_s[k]);
    os << "  " << k << ": " << ms << " ms per step\n";
  }
  return os.str();
}

}  // namespace

namespace {

int cores_here() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The reduce phase: its pairs, and its time and memory per rank on `ranks` ranks (jobs/reduce_work.hpp's
// cost model, with the rates measured here), each rank with a core of its own and, when there are more
// ranks than this machine has cores, all of them here.
std::string reduce_estimate_text(const ReducePlan& plan, double stored_bytes, const ReduceRates& rates, int ranks) {
  const ReduceShape shape = reduce_shape(plan, stored_bytes);
  std::uint64_t values = 0;
  for (auto n : plan.sizes) values += static_cast<std::uint64_t>(n);
  const std::size_t V = plan.variants.size();
  std::ostringstream os;
  os << "reduce: " << plan.pairs.size() << " of " << V * (V - 1) / 2 << " pairs (" << plan.pairs_note << ") x "
     << plan.steps.size() << " step" << (plan.steps.size() == 1 ? "" : "s") << ", "
     << (plan.per_tensor ? std::to_string(plan.tensors.size() - 1) + " tensors" : std::string("no tensor"))
     << (plan.whole_model ? " and the whole model" : "") << ", " << values << " values per run and step, compared as "
     << (plan.f64 ? "fp64" : "fp32") << "\n";
  const auto line = [&](const std::string& where, int cores) {
    const ReduceEstimate e = estimate_reduce(shape, ranks, cores, rates);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "reduce estimate on %d rank%s, %s: %.3g s per step, %s in all (per step on the busiest rank: reading %.3g s, "
                  "sorting %.3g s, moving values %.3g s, pairwise sums %.3g s; once: fresh pages %.3g s); peak memory %s per "
                  "rank (of it the whole model's shares %s)\n",
                  ranks, ranks == 1 ? "" : "s", where.c_str(), e.step_seconds, duration_text(e.seconds).c_str(),
                  e.read_seconds, e.sort_seconds, e.move_seconds, e.pair_seconds, e.touch_seconds,
                  human_bytes(e.peak_bytes).c_str(), human_bytes(e.share_bytes).c_str());
    os << buf;
  };
  line("a core each", ranks);
  if (ranks > cores_here())
    line("all on this machine's " + std::to_string(cores_here()) + " cores", cores_here());
  else if (2 * ranks <= cores_here())
    line("on this machine's " + std::to_string(cores_here()) + " cores (each rank's reader on a core of its own)", cores_here());
  os << "  (rates measured here: " << rates.source << ")\n";
  return os.str();
}

// The read rates of an imported study's files (already in the page cache after the check), in CPU time
// as the other rates: a one-value read, and the largest tensor (up to 2^26 values) of each of the first
// three runs' first files, each read once, as the reduce reads them (from pages the CPU's caches no
// longer hold, into a buffer whose pages were written before: their first write is the fresh pages'
// rate).
void measure_import_reads(const Study& st, const ReducePlan& plan, double stored_bytes, ReduceRates& rates) {
  std::size_t largest = 0;
  for (std::size_t t = 1; t + 1 < plan.tensors.size(); ++t)
    if (plan.sizes[t] > plan.sizes[largest]) largest = t;
  const auto count = static_cast<std::size_t>(std::min<std::int64_t>(plan.sizes[largest], std::int64_t{1} << 26));
  const std::size_t runs = std::min<std::size_t>(3, plan.files.size());
  std::vector<std::string> firsts;
  for (std::size_t v = 0; v < runs; ++v) firsts.push_back(plan.files[v][0]);
  io::ImportedStep step(st.import, firsts);
  std::vector<double> buf(plan.f64 ? count : (count + 1) / 2);
  const auto read = [&](std::size_t v, std::size_t n) {
    if (plan.f64) step.read(v, {plan.tensors[largest]}, {plan.sizes[largest]}, 0, n, buf.data());
    else step.read(v, {plan.tensors[largest]}, {plan.sizes[largest]}, 0, n, reinterpret_cast<float*>(buf.data()));
  };
  double call = 1e30, bulk = 0;
  for (std::size_t v = 0; v < runs; ++v) {
    double t0 = thread_cpu_seconds();
    read(v, 1);
    call = std::min(call, thread_cpu_seconds() - t0);
    t0 = thread_cpu_seconds();
    read(v, count);
    bulk += thread_cpu_seconds() - t0;
  }
  rates.read_call = call;
  rates.read_byte = std::max(0.0, bulk - static_cast<double>(runs) * call) / (static_cast<double>(runs * count) * stored_bytes);
  char what[160];
  std::snprintf(what, sizeof what, "; reads %.3g GB/s of ", 1e-9 / rates.read_byte);
  rates.source += what + plan.files[0][0] + (runs > 1 ? " and the next runs'" : "");
}

// The file-backed memory (code and libraries) of fastudy-lite, the program a reduce runs in
// (jobs/launcher.cpp): 17.6 MiB resident during a reduce of GPT-2-sized runs on machine dev
// (/proc/PID/status RssFile); Open MPI's shared-memory segments come on top with several ranks.
constexpr double kReduceProgramFileBytes = 24.0 * (1 << 20);

// The resident memory the reduce's program starts with, for its peak memory estimate: this process's
// own data (its anonymous resident memory) and fastudy-lite's code and libraries, not this program's
// (it holds LibTorch), unless the study imports torch.save files, which fastudy-main reads.
void reduce_program_base(const Study& st, ReduceRates& rates) {
  if (st.imported() && imports_torch_files(st)) return;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("RssAnon:", 0) == 0) {
      const double kib = std::strtod(line.c_str() + 8, nullptr);
      if (kib > 0) rates.base_bytes = kib * 1024.0 + kReduceProgramFileBytes;
    }
}

// An imported study: every file checked as reduce checks it (bad input exits 2 here as there), then
// what reduce would compare: runs, steps, tensors and the bytes it reads, and the reduce's estimate on
// `ranks` ranks.
int plan_imported(const JobContext& ctx, int ranks) {
  const Study& st = *ctx.study;
  ImportCheck check = check_imports(st, nullptr);
  choose_reduce_work(st, check.plan);
  const ReducePlan& p = check.plan;
  std::uint64_t elements = 0;
  for (auto n : p.sizes) elements += static_cast<std::uint64_t>(n);
  std::ostringstream os;
  os << "# study " << st.name << " (" << st.file << "), config hash " << st.hash << "\n";
  os << "phases: ";
  for (std::size_t i = 0; i < st.phases.size(); ++i) os << (i ? ", " : "") << st.phases[i];
  os << "\noutput: " << (ctx.opts.out.empty() ? st.out : ctx.opts.out) << "\n";
  os << "imported runs: " << st.import.path << "\n";
  os << "grid: " << grid_shape(st) << " = " << p.variants.size() << " runs\n";
  os << "steps: ";
  for (std::size_t i = 0; i < p.steps.size(); ++i) os << (i ? ", " : "") << p.steps[i];
  os << "\ntensors: " << p.tensors.size() - 1 << " (" << elements << " values per checkpoint, compared as "
     << (p.f64 ? "fp64" : "fp32") << ")\n";
  os << "files: " << check.records.size() << ", " << human_bytes(static_cast<double>(check.data_bytes))
     << " of tensors to read (" << p.variants.size() << " runs x " << p.steps.size() << " steps)\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-32s %s\n", "run", "first file");
  os << line;
  for (std::size_t v = 0; v < p.variants.size(); ++v) {
    std::snprintf(line, sizeof line, "%-32s %s\n", p.variants[v]->id.c_str(), p.files[v].front().c_str());
    os << line;
  }
  const double stored = static_cast<double>(check.data_bytes) / static_cast<double>(elements * p.variants.size() * p.steps.size());
  ReduceRates rates = measure_reduce_rates(p.f64 ? 8 : 4, ranks, p.variants.size(), p.pairs.size());
  reduce_program_base(st, rates);
  measure_import_reads(st, p, stored, rates);
  os << "\n" << reduce_estimate_text(p, stored, rates, ranks);
  std::cout << os.str();
  return kExitOk;
}

}  // namespace

int job_plan(JobContext& ctx) {
  const Study& st = *ctx.study;
  const int ranks = ctx.opts.plan.ranks > 0 ? ctx.opts.plan.ranks : std::max(1, mpi::launched_ranks());
  if (ctx.opts.plan.measure_steps < 0)
    throw UsageError("--measure-steps must be >= 0 (got " + std::to_string(ctx.opts.plan.measure_steps) + ")",
                     "0 leaves the time estimate out");
  if (st.imported()) return plan_imported(ctx, ranks);
  const int rpv = st.train.ranks_per_variant;
  if (ranks % rpv != 0)
    throw UsageError(std::to_string(ranks) + " ranks cannot be split into groups of ranks_per_variant = " +
                         std::to_string(rpv) + " (" + std::to_string(ranks % rpv) + " would be left over)",
                     "use a multiple of " + std::to_string(rpv) + " ranks, or change [train] ranks_per_variant");
  const int groups = ranks / rpv;
  const std::size_t nv = st.variants.size();

  std::ostringstream os;
  os << "# study " << st.name << " (" << st.file << "), config hash " << st.hash << "\n";
  os << "phases: ";
  for (std::size_t i = 0; i < st.phases.size(); ++i) os << (i ? ", " : "") << st.phases[i];
  os << "\noutput: " << (ctx.opts.out.empty() ? st.out : ctx.opts.out) << "\n";
  os << "grid: " << grid_shape(st) << " = " << nv << " variant" << (nv == 1 ? "" : "s") << "\n\n";

  double total_ckpt = 0;
  std::int64_t steps_total = 0;
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %-17s %12s %12s %14s\n", "variant", "hash", "params", "checkpoints",
                "ckpt bytes");
  os << line;
  VariantEstimate first{};
  double most_work = 1;
  for (std::size_t i = 0; i < nv; ++i) {
    const Variant& v = st.variants[i];
    VariantEstimate e = estimate_variant(v);
    if (i == 0) first = e;
    most_work = std::max(most_work, e.matmul_work);
    total_ckpt += e.checkpoint_bytes * static_cast<double>(e.checkpoints);
    steps_total += v.train.steps;
    std::snprintf(line, sizeof line, "%-32s %-17s %12lld %12lld %14s\n", v.id.c_str(), v.hash.c_str(),
                  static_cast<long long>(e.params), static_cast<long long>(e.checkpoints),
                  human_bytes(e.checkpoint_bytes * static_cast<double>(e.checkpoints)).c_str());
    os << line;
  }
  os << "\nranks: " << ranks << " -> " << groups << " group" << (groups == 1 ? "" : "s") << " of " << rpv
     << " rank" << (rpv == 1 ? "" : "s") << " (ranks_per_variant)\n";
  const std::size_t rounds = (nv + static_cast<std::size_t>(groups) - 1) / static_cast<std::size_t>(groups);
  os << "schedule: " << nv << " variants over " << groups << " groups, dynamic; about " << rounds
     << " variant" << (rounds == 1 ? "" : "s") << " per group";
  if (static_cast<std::size_t>(groups) > nv)
    os << "; " << (static_cast<std::size_t>(groups) - nv) << " group(s) will idle in the train phase (fewer variants than groups)";
  os << "\ncheckpoints: " << human_bytes(total_ckpt) << " in total\n";
  os << "memory per rank (estimate, training): " << human_bytes(first.memory_per_rank) << "\n";
  if (most_work > 1) {
    char work[32];
    std::snprintf(work, sizeof work, "%.2g", most_work);
    os << "matmul work per step: up to " << work << "x the default [numerics] (bf16x3 3x, recompute 4/3x)\n";
  }
  os << "batch per rank: " << st.train.batch / rpv << " sequences of " << st.model.seq_len << " tokens\n";
  if (st.has_phase("reduce")) {
    // fastudy's checkpoints store the parameters as fp32 (fp64 for fp64 variants), read by range from
    // the page cache: a copy with conversion.
    const ReducePlan reduce = planned_reduce(st);
    const double stored = reduce.f64 ? 8.0 : 4.0;
    ReduceRates rates = measure_reduce_rates(reduce.f64 ? 8 : 4, ranks, reduce.variants.size(), reduce.pairs.size());
    reduce_program_base(st, rates);
    os << reduce_estimate_text(reduce, stored, rates, ranks);
  }
  // Where the variants train: [train] device (or --device), auto resolved as the train job does, on
  // this machine's GPUs or on nodes of --gpus-per-node; and each group's gradient reducer
  // (src/runtime/placement.hpp), as the train job chooses it.
  const bool modelled = ctx.opts.plan.gpus_per_node >= 0;
  std::string no_gpu = modelled ? std::string("--gpus-per-node 0") : std::string();
  const int gpus = modelled ? ctx.opts.plan.gpus_per_node : (rank_has_gpu(&no_gpu) ? visible_gpus() : 0);
  const bool want_gpu = st.train.device != Device::cpu;
  const bool on_gpu = want_gpu && gpus > 0;
  const std::string per_node = std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") + " per node" +
                               (modelled ? " (--gpus-per-node)" : " (seen here)");
  os << "device: " << to_string(st.train.device);
  const std::string gpu_text = "one GPU per rank by node-local rank, " + per_node;
  if (st.train.device == Device::auto_) os << " -> " << (on_gpu ? "cuda, " + gpu_text : "cpu (" + no_gpu + ")");
  else if (on_gpu) os << ", " << gpu_text;
  os << "\n";
  if (ctx.opts.plan.ranks_per_node > 0) {
    const int nodes = (ranks + ctx.opts.plan.ranks_per_node - 1) / ctx.opts.plan.ranks_per_node;
    os << "nodes: " << nodes << " of " << ctx.opts.plan.ranks_per_node << " rank" << (ctx.opts.plan.ranks_per_node == 1 ? "" : "s")
       << " (--ranks-per-node)\n";
  }
  const std::vector<RankPlacement> placements = modelled_placements(ranks, ctx.opts.plan.ranks_per_node, on_gpu ? gpus : 0);
  const std::vector<ReducerChoice> reducers = choose_reducers(placements, rpv, on_gpu, modelled || have_nccl());
  if (rpv == 1) {
    os << "gradient reducer: none (one rank per variant: nothing to average)\n";
  } else {
    for (const std::string& line : describe_reducers(reducers, rpv)) os << "gradient reducer of " << line << "\n";
  }
  std::cout << os.str() << std::flush;
  // The checks `fastudy run` makes before it starts (on this machine, all ranks on this host).
  PreflightScope scope;
  scope.train = st.has_phase("train");
  scope.report = st.has_phase("report");
  scope.ranks = ranks;
  scope.ranks_on_host = ctx.opts.plan.ranks_per_node > 0 ? std::min(ranks, ctx.opts.plan.ranks_per_node) : ranks;
  scope.out = ctx.opts.out.empty() ? st.out : ctx.opts.out;
  const std::vector<std::string> problems = preflight_problems(st, scope);
  // Only a grid that would start is timed (a missing data file, say, is the preflight's to name).
  if (problems.empty() && ctx.opts.plan.measure_steps > 0 && st.has_phase("train"))
    std::cout << time_estimate(st, groups, rpv, ctx.opts.plan.measure_steps) << std::flush;
  if (problems.empty()) {
    std::cout << "preflight: every check passed (layout, data, memory, disk" << (scope.report ? ", report modules" : "")
              << ")\n";
    return kExitOk;
  }
  // An error line (-q keeps it), then the problems.
  log::error("preflight: `fastudy run` with " + std::to_string(ranks) + " rank(s) on this machine would stop before it starts:");
  for (const auto& p : problems) std::cerr << "  - " << p << "\n";
  return kExitUsage;
}

}  // namespace fastudy
