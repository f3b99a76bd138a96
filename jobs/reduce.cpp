// `fastudy reduce GRID.toml|OUT`: how far apart did the variants' weights drift, and which grid axis
// moved them most. Reads the checkpoints and computes, for every checkpoint step, the distances (W1,
// W2, max |d|, mean |d|, relative L2: [reduce] metrics) between the pairs of variants the ranking and
// the verdict use ([reduce] pairs), per tensor ([reduce] per_tensor) and for the whole model (every
// parameter as one distribution: [reduce] whole_model), and ranks the axes as deviation sources
// (analysis/ranking.hpp).
//
// Pairs on demand: the verdict, the ranking and the report's per-condition views use only the pairs of
// variants that differ in one axis (verdict_pairs: the optimisations' pairs, the references' and the
// replicates' for the noise floor and the intervals, the fp64 twins), about R x axes of the R(R-1)/2;
// [reduce] pairs = "all" computes every pair, a list adds the pairs it names. A pair's numbers are the
// same bits whichever other pairs are computed (analysis/distance.hpp).
//
// Work split, per checkpoint step (the schedule and its cost: jobs/reduce_work.hpp):
//   pass 1, per tensor: the tensors are dealt whole to one rank (largest first to the least loaded) and
//     computed there, as long as every rank stays within kDealBalance of the mean; the largest ones the
//     balance needs are split over all ranks (schedule_reduce, jobs/reduce_work.hpp): rank q reads window
//     q (block_aligned_part) of every variant's values, accumulates the elementwise sums over it, and
//     the ranks sort the tensor together (analysis/sorted_exchange.hpp, a sample sort that leaves each
//     rank window q of the sorted positions) and accumulate the sorted sums over their windows; the
//     partial sums are combined with MPI_Allreduce. A rank reads each task's values straight into their
//     place in its share of the whole model, sorts them there and keeps them (sorted runs);
//   pass 2, whole model: the shares are sorted over the ranks by value range, one variant at a time
//     (DistributedSort::sort_shares), so each rank holds window q of every variant's sorted model, about
//     R P / N values, never the whole model; the sorted sums over the windows are combined with the
//     elementwise sums of every tensor (PairwisePartials::combine_elementwise: additive over tensors).
// Every value is read once per step, by one rank. A reader thread reads the next task's values while
// the current task is sorted and exchanged; the buffers keep their memory from task to task and step
// to step. Block-aligned
// windows give bit-identical sums, so the results do not depend on the number of ranks. Rank 0 gathers
// the results in task order and writes deviation.h5/.csv, axes.csv, ranking.csv, verdict.csv and
// twins.csv (jobs/reduce_output.hpp).
//
// An imported study ([import]) takes its runs from files other programs wrote: every file is checked
// first (jobs/reduce_import.hpp; bad input is an exit 2 before any distance), the study folder is made
// when this is its first phase, imported.csv records the files, and the tasks read their values by
// range from the files (src/io/import_runs.hpp); fastudy's own checkpoints are read by range too
// (CheckpointParams), after the whole-file check of every one of them.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include <boost/program_options.hpp>

#include "analysis/distance.hpp"
#include "analysis/ranking.hpp"
#include "analysis/sorted_exchange.hpp"
#include "analysis/value_buffer.hpp"
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
#include "jobs/reduce_work.hpp"
#include "src/io/checkpoint.hpp"
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
    plan.f64 |= a.dtype == DType::f64;
  }
  plan.tensors.push_back(kModelTensor);
  return plan;
}

std::string pack_plan(const ReducePlan& p) {
  std::ostringstream os;
  os << "d " << p.f64 << '\n';
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
      case 'd': p.f64 = body == "1"; break;
      case 'v': p.variants.push_back(st.find_variant(body)); break;
      case 'l': p.left_out.push_back(body); break;
      case 's': p.steps.push_back(std::stoll(body)); break;
      case 't': p.tensors.push_back(body); break;
      case 'n': p.sizes.push_back(std::stoll(body)); break;
    }
  }
  return p;
}

double since(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
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

// ---- the values of one step ---------------------------------------------------------------------

// Values [begin, end) of tensor t of variant v at one step, converted to float or double.
class StepValues {
 public:
  virtual ~StepValues() = default;
  virtual void read(std::size_t v, std::size_t t, std::size_t begin, std::size_t end, float* dst) = 0;
  virtual void read(std::size_t v, std::size_t t, std::size_t begin, std::size_t end, double* dst) = 0;
};

// fastudy's checkpoints (checked whole before the work): each file opened once for the step.
class CheckpointValues : public StepValues {
 public:
  CheckpointValues(const ReducePlan& plan, const std::string& out, std::int64_t step) : plan_(plan) {
    for (const auto* v : plan.variants) files_.push_back(std::make_unique<CheckpointParams>(checkpoint_path(out, v->id, step)));
  }
  void read(std::size_t v, std::size_t t, std::size_t begin, std::size_t end, float* dst) override {
    files_[v]->read(plan_.tensors[t], begin, end - begin, dst);
  }
  void read(std::size_t v, std::size_t t, std::size_t begin, std::size_t end, double* dst) override {
    files_[v]->read(plan_.tensors[t], begin, end - begin, dst);
  }

 private:
  const ReducePlan& plan_;
  std::vector<std::unique_ptr<CheckpointParams>> files_;
};

// An imported study's files of one step (checked before the work).
class ImportedValues : public StepValues {
 public:
  ImportedValues(const Study& st, const ReducePlan& plan, std::size_t si) : plan_(plan), step_(st.import, paths(plan, si)) {}
  void read(std::size_t v, std::size_t t, std::size_t begin, std::size_t end, float* dst) override {
    step_.read(v, {plan_.tensors[t]}, {plan_.sizes[t]}, begin, end, dst);
  }
  void read(std::size_t v, std::size_t t, std::size_t begin, std::size_t end, double* dst) override {
    step_.read(v, {plan_.tensors[t]}, {plan_.sizes[t]}, begin, end, dst);
  }

 private:
  static std::vector<std::string> paths(const ReducePlan& plan, std::size_t si) {
    std::vector<std::string> out;
    for (const auto& files : plan.files) out.push_back(files[si]);
    return out;
  }
  const ReducePlan& plan_;
  io::ImportedStep step_;
};

std::unique_ptr<StepValues> step_values(const Study& st, const ReducePlan& plan, const std::string& out, std::size_t si) {
  if (plan.files.empty()) return std::make_unique<CheckpointValues>(plan, out, plan.steps[si]);
  return std::make_unique<ImportedValues>(st, plan, si);
}

// One read of a task: values [begin, end) of tensor t of every variant, variant v's at [v L, (v+1) L).
struct TaskRead {
  std::size_t tensor = 0;
  std::size_t begin = 0, end = 0;
};

// This rank's task reads of a step, in order, each to the places `places` gives it (one pointer per
// variant, L values each): with `ahead`, a thread reads task k + 1 while the caller works on task k
// (places(k + 1) must not be in use by task k); without, get() reads. A read's error is thrown by get().
template <class T>
class TaskReader {
 public:
  using Places = std::function<std::vector<T*>(std::size_t k)>;
  TaskReader(StepValues& values, std::vector<TaskRead> reads, std::size_t variants, Places places, bool ahead)
      : values_(values), reads_(std::move(reads)), variants_(variants), places_(std::move(places)) {
    if (ahead && reads_.size() > 1) thread_ = std::thread([this] { run(); });
  }
  ~TaskReader() { stop(); }
  TaskReader(const TaskReader&) = delete;
  TaskReader& operator=(const TaskReader&) = delete;

  // The places of read k, filled (call in order, each after done(k - 1)).
  const std::vector<T*>& get(std::size_t k) {
    if (!thread_.joinable()) {
      fill(k);
      return filled_[k % 2];
    }
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return read_ > k || error_; });
    if (error_) std::rethrow_exception(error_);
    return filled_[k % 2];
  }
  // The caller is done with read k: its places may take read k + 2.
  void done(std::size_t k) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = k + 1;
    }
    changed_.notify_all();
  }
  // Ends the reading.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void fill(std::size_t k) {
    const TaskRead& r = reads_[k];
    std::vector<T*>& at = filled_[k % 2];
    at = places_(k);
    for (std::size_t v = 0; v < variants_; ++v) values_.read(v, r.tensor, r.begin, r.end, at[v]);
  }
  void run() {
    for (std::size_t k = 0; k < reads_.size(); ++k) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || released_ + 2 > k; });
        if (stop_) return;
      }
      try {
        fill(k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
        changed_.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        read_ = k + 1;
      }
      changed_.notify_all();
    }
  }

  StepValues& values_;
  const std::vector<TaskRead> reads_;
  const std::size_t variants_;
  const Places places_;
  std::vector<T*> filled_[2];
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t read_ = 0;      // reads finished
  std::size_t released_ = 0;  // reads the caller is done with
  bool stop_ = false;
  std::exception_ptr error_;
};

// ---- the work of every step -----------------------------------------------------------------------

// This rank's results: per task its index and its result (reduce_output.hpp TaskResults), as bytes;
// `stopped` when a stop signal ended the work.
struct RankWork {
  ByteWriter results;
  bool stopped = false;
  double read_s = 0, wait_s = 0;  // rank 0's log: opening the step's files, and waiting for the reader
                                  // thread's reads
};

// One task's partials as its result: per listed pair and metric, (i, j) then (j, i).
std::vector<double> task_result(const ReducePlan& plan, const PairwisePartials& p) {
  const PairwiseMatrix m = p.finalize();
  std::vector<double> out;
  out.reserve(plan.pairs.size() * kPairMetricCount * 2);
  for (const auto& [i, j] : plan.pairs)
    for (const PairMetric& metric : kPairMetrics)
      for (const PairMetrics* pm : {&m.at(i, j), &m.at(j, i)}) out.push_back(pm->*metric.value);
  return out;
}

void put_result(RankWork& work, std::size_t k, const std::vector<double>& r) {
  work.results.put<std::uint64_t>(k);
  work.results.put_bytes(r.data(), r.size() * sizeof(double));
}

// Collective: every step's tasks (see the top of this file) for values of type T.
template <class T>
class StepWork {
 public:
  StepWork(const Study& st, const ReducePlan& plan, const std::string& out, mpi::Comm& world)
      : st_(st), plan_(plan), out_(out), world_(world), sorter_(world),
        schedule_(schedule_reduce(plan.sizes, world.size())), shares_(plan.variants.size()) {
    for (std::size_t t : schedule_.order)
      if (schedule_.split[t] || schedule_.owner[t] == world.rank()) mine_.push_back(t);
    for (auto n : plan.sizes) model_values_ += static_cast<std::size_t>(n);
    which_ = plan.needs(MetricPass::sorted_w2) ? SortedMetrics::w1_w2 : SortedMetrics::w1;
    elementwise_ = plan.needs(MetricPass::elementwise);
    for (std::size_t t : mine_) mine_values_ += static_cast<double>(plan.sizes[t]) / (schedule_.split[t] ? world.size() : 1);
    // The sort's scratch for the largest sort of any step (a dealt tensor, a split one's window, the
    // model's window; a received range may pass its window by a few per cent, within reserve_sort's
    // margin), taken once: a later, larger sort would take new memory and write its pages anew.
    std::size_t largest = plan.whole_model ? model_window() : 0;
    for (std::size_t t : mine_) {
      const auto n = static_cast<std::size_t>(plan.sizes[t]);
      const IndexRange w = schedule_.split[t] ? block_aligned_part(n, static_cast<std::size_t>(world.size()),
                                                                   static_cast<std::size_t>(world.rank()))
                                              : IndexRange{0, n};
      largest = std::max(largest, w.end - w.begin);
    }
    sorter_.reserve_sort(largest);
  }

  const SortTraffic& traffic() const { return sorter_.traffic(); }
  std::size_t task_count() const { return mine_.size() + (plan_.whole_model ? 1 : 0); }

  // One step; false when a stop signal ended it (on every rank).
  bool run(std::size_t si, RankWork& work, const std::function<void(double)>& task_done) {
    const std::size_t V = plan_.variants.size(), NT = plan_.tensors.size();  // tasks per step
    const std::size_t R = static_cast<std::size_t>(world_.size()), r = static_cast<std::size_t>(world_.rank());
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<StepValues> values = step_values(st_, plan_, out_, si);
    std::vector<TaskRead> reads;
    std::vector<std::size_t> at;  // each task's place in the shares
    std::size_t share = 0;
    for (std::size_t t : mine_) {
      const auto n = static_cast<std::size_t>(plan_.sizes[t]);
      const IndexRange w = schedule_.split[t] ? block_aligned_part(n, R, r) : IndexRange{0, n};
      reads.push_back({t, w.begin, w.end});
      at.push_back(share);
      share += w.end - w.begin;
    }
    // With the whole model, each task's values are read straight to their place in the shares (the
    // rank's share of each variant: its tasks' values in task order), sorted there and kept; the
    // shares keep their memory from step to step (and hold the model's window after its sort).
    // Without, to two slots that the reader and the caller take turns with.
    if (plan_.whole_model)
      for (auto& s : shares_) {
        s.clear();
        s.reserve(std::max(share, model_window()));
        s.assign_uninitialized(share);
      }
    const auto places = [&](std::size_t k) {
      std::vector<T*> p(V);
      const std::size_t L = reads[k].end - reads[k].begin;
      ValueBuffer<T>& slot = slots_[k % 2];
      if (!plan_.whole_model) slot.assign_uninitialized(V * L);
      for (std::size_t v = 0; v < V; ++v) p[v] = plan_.whole_model ? shares_[v].data() + at[k] : slot.data() + v * L;
      return p;
    };
    std::vector<std::size_t> runs;
    work.read_s += since(t0, std::chrono::steady_clock::now());
    TaskReader<T> reader(*values, reads, V, places, true);
    // This rank's share of the whole model's elementwise sums (its tasks, its windows of split ones).
    PairwisePartials model_elementwise(V, plan_.pairs);
    for (std::size_t k = 0; k < mine_.size(); ++k) {
      const std::size_t t = mine_[k];
      const bool split = schedule_.split[t] != 0;
      if (split && world_.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) return false;
      // A signal skips this rank's own tasks; it leaves the loop only at the next collective check,
      // together with the other ranks (the check after the loop then fails the job everywhere).
      if (!split && stop_signal_received()) continue;
      const auto t1 = std::chrono::steady_clock::now();
      const std::vector<T*>& x = reader.get(k);
      const auto t2 = std::chrono::steady_clock::now();
      work.wait_s += since(t1, t2);
      const TaskRead& rd = reads[k];
      const std::size_t n = static_cast<std::size_t>(plan_.sizes[t]), L = rd.end - rd.begin;
      PairwisePartials p(V, plan_.pairs);
      if (elementwise_) accumulate_elementwise(std::vector<const T*>(x.begin(), x.end()), rd.begin, rd.end, p, rd.begin);
      model_elementwise.combine_elementwise(p);
      if (plan_.per_tensor) {
        // Sorted where they were read (in the shares: the sorted runs of the model's sort).
        if (split) sorter_.sort_windows(x, n);
        else sorter_.sort_each(x, L);
        SortedSet<T> set;
        for (std::size_t v = 0; v < V; ++v) set.add_sorted_view(x[v], L, rd.begin, n);
        accumulate_sorted(set, rd.begin, rd.end, p, which_);
      }
      if (plan_.whole_model) runs.push_back(L);
      reader.done(k);
      if (plan_.per_tensor) {
        if (split) {
          allreduce_partials(world_, p);
          p.set_has_w2(which_ == SortedMetrics::w1_w2);
        }
        if (!split || world_.is_root()) put_result(work, si * NT + t, task_result(plan_, p));
      }
      task_done(static_cast<double>(L));
    }
    reader.stop();
    if (world_.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0) return false;
    if (plan_.whole_model) {
      sorter_.sort_shares(shares_, model_values_, plan_.per_tensor ? runs : std::vector<std::size_t>{});
      const IndexRange w = block_aligned_part(model_values_, R, r);
      SortedSet<T> set;
      for (std::size_t v = 0; v < V; ++v) set.add_sorted_view(shares_[v].data(), w.end - w.begin, w.begin, model_values_);
      PairwisePartials p(V, plan_.pairs);
      accumulate_sorted(set, w.begin, w.end, p, which_);
      p.combine_elementwise(model_elementwise);
      allreduce_partials(world_, p);
      p.set_has_w2(which_ == SortedMetrics::w1_w2);
      if (world_.is_root()) put_result(work, si * NT + (NT - 1), task_result(plan_, p));
      task_done(static_cast<double>(w.end - w.begin));
    }
    return true;
  }

  // The values of this rank's tasks and model window per step (the progress line's unit).
  double values_per_step() const {
    return mine_values_ + (plan_.whole_model ? static_cast<double>(model_window()) : 0.0);
  }

 private:
  std::size_t model_window() const {
    const IndexRange w = block_aligned_part(model_values_, static_cast<std::size_t>(world_.size()),
                                            static_cast<std::size_t>(world_.rank()));
    return w.end - w.begin;
  }

  const Study& st_;
  const ReducePlan& plan_;
  const std::string& out_;
  mpi::Comm& world_;
  DistributedSort<T> sorter_;
  ReduceSchedule schedule_;
  std::vector<std::size_t> mine_;  // tensors this rank takes part in, in the schedule's order
  // The buffers keep their memory from task to task and step to step (each page is touched once per
  // reduce, not once per task or step): the shares (with the whole model) or the reader's two slots
  // (without), and the distributed sort's.
  std::vector<ValueBuffer<T>> shares_;
  ValueBuffer<T> slots_[2];
  std::size_t model_values_ = 0;
  double mine_values_ = 0;
  SortedMetrics which_ = SortedMetrics::w1;
  bool elementwise_ = true;
};

template <class T>
RankWork compute_steps(const Study& st, const ReducePlan& plan, const std::string& out, mpi::Comm& world) {
  StepWork<T> steps(st, plan, out, world);
  RankWork work;
  // This rank's work on the console (rank 0; the schedule balances the ranks): tasks done, the speed,
  // and the time left from the values still to process at the values per second measured so far.
  const double mine_values = steps.values_per_step() * static_cast<double>(plan.steps.size());
  const std::size_t mine_tasks = steps.task_count() * plan.steps.size();
  double done_values = 0;
  std::size_t done_tasks = 0;
  ProgressLine progress;
  const auto start = std::chrono::steady_clock::now();
  const auto task_done = [&](double values) {
    done_values += values;
    ++done_tasks;
    const double s = since(start, std::chrono::steady_clock::now());
    progress.update("reduce: " + std::to_string(done_tasks) + "/" + std::to_string(mine_tasks) +
                    " tasks (step x tensor), " + rate_text(static_cast<double>(done_tasks) / s) + " tasks/s, " +
                    eta_text(s * (mine_values - done_values) / std::max(done_values, 1.0)));
  };
  for (std::size_t si = 0; si < plan.steps.size() && !work.stopped; ++si)
    work.stopped = !steps.run(si, work, task_done);
  progress.finish();
  const SortTraffic& tr = steps.traffic();
  log::debug("reduce: rank " + std::to_string(world.rank()) + " sent " + std::to_string(tr.values_sent) +
             " values in the sorts' partitions, moved " + std::to_string(tr.values_moved) +
             " to exact windows; largest value range " + number_text(100 * tr.largest_excess) + "% over its window");
  return work;
}

// Rank 0: every computed task's result from the ranks' bytes (RankWork::results), in task order;
// the tasks [reduce] per_tensor or whole_model leave out stay empty.
TaskResults collect_results(const ReducePlan& plan, const std::vector<std::string>& parts) {
  const std::size_t T = plan.tensors.size(), tasks = plan.steps.size() * T;
  const std::size_t size = plan.pairs.size() * kPairMetricCount * 2;
  TaskResults results(tasks);
  for (const auto& part : parts) {
    ByteReader in(part, "reduce: the results a rank sent");
    while (!in.done()) {
      const auto k = in.get<std::uint64_t>();
      if (k >= tasks) throw Error("reduce: a rank sent the result of task " + std::to_string(k) + " of " + std::to_string(tasks));
      results[k].resize(size);
      in.get_bytes(results[k].data(), size * sizeof(double));
    }
  }
  for (std::size_t k = 0; k < tasks; ++k) {
    const bool model = k % T == T - 1;
    if ((model ? plan.whole_model : plan.per_tensor) && results[k].empty() && !plan.pairs.empty())
      throw Error("reduce: task " + std::to_string(k) + " produced no result");
  }
  return results;
}

// The ranking of the axes on the whole-model matrices (W1 and max |d| of every step); the left-out
// variants become notes. Without the whole model ([reduce] whole_model = false) there is nothing to
// rank: no rows, no verdict, no twins, and a note that says why.
Ranking rank_axes(const ReducePlan& plan, const TaskResults& results, const std::vector<RankingAxis>& axes) {
  Ranking ranking;
  if (!plan.whole_model) {
    ranking.notes.push_back("[reduce] whole_model = false: the ranking and the verdict rest on the whole-model distances, "
                            "which were not computed");
    for (const auto& l : plan.left_out) ranking.notes.push_back("left out " + l);
    return ranking;
  }
  const std::size_t T = plan.tensors.size();
  std::vector<StepMatrices> sm;
  for (std::size_t si = 0; si < plan.steps.size(); ++si) {
    const auto& m = results[si * T + (T - 1)];
    StepMatrices s;
    s.step = plan.steps[si];
    s.w1 = task_matrix(plan, m, pair_metric_index("w1"));
    s.max_abs = task_matrix(plan, m, pair_metric_index("max_abs"));
    sm.push_back(std::move(s));
  }
  ranking = rank_deviation_sources(axes, ranking_variants(plan.variants), sm);
  for (const auto& l : plan.left_out) ranking.notes.push_back("left out " + l);
  return ranking;
}

}  // namespace

void reduce_options(po::options_description& d, CliOptions& o) {
  d.add_options()("allow-missing", po::bool_switch(&o.reduce.allow_missing),
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
    choose_reduce_work(st, plan);
    on_root(world, [&] {
      check_output_space(out, static_cast<double>(reduce_output_bytes(plan)), "the reduce's results (deviation.h5, deviation.csv, ...)");
      if (!file_exists(path("study.toml")) || ctx.opts.command == "run") prepare_output(ctx);
      manifest::add(out, {{manifest::Kind::file, "reduce", "imported.csv"}});
      write_imported_csv(out, check.records, ctx.prov);
    });
  } else {
    on_root(world, [&] { check_study_dir(st, out); });
    plan = agree_on_plan(st, out, ctx.opts.reduce.allow_missing, world);
    choose_reduce_work(st, plan);
    on_root(world, [&] {
      check_output_space(out, static_cast<double>(reduce_output_bytes(plan)), "the reduce's results (deviation.h5, deviation.csv, ...)");
    });
  }
  const auto t_checked = std::chrono::steady_clock::now();
  log::info("reduce: " + std::to_string(plan.variants.size()) + " variants x " + std::to_string(plan.steps.size()) +
            " steps x " + std::to_string(plan.tensors.size() - 1) + " tensors (+ whole model), " +
            std::to_string(plan.pairs.size()) + " of " +
            std::to_string(plan.variants.size() * (plan.variants.size() - 1) / 2) + " pairs (" + plan.pairs_note +
            "), on " + std::to_string(world.size()) + " rank(s)");

  const RankWork work = plan.f64 ? compute_steps<double>(st, plan, out, world) : compute_steps<float>(st, plan, out, world);
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
    // "computed": every step's work on this rank, start to end (what `fastudy plan` estimates).
    log::debug("reduce: rank 0 checked the files for " + number_text(since(t_start, t_checked)) + " s, computed for " +
               number_text(since(t_checked, t_computed)) + " s (of it opening the files " + number_text(work.read_s) +
               " s, waiting for reads " + number_text(work.wait_s) + " s), gathered for " + number_text(since(t_computed, t_gathered)) +
               " s, wrote deviation.h5/.csv for " + number_text(since(t_gathered, t_written)) +
               " s, ranked and wrote the rest for " + number_text(since(t_written, t_end)) + " s");
    log::info("reduce: wrote deviation.h5, deviation.csv, axes.csv, ranking.csv, verdict.csv and twins.csv in " + out);
  });
  return kExitOk;
}

}  // namespace fastudy
