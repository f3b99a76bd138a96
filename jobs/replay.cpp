// `fastudy replay OUT --variant ID --from STEP [--steps K] [--set AXIS=VALUE ...]`: a counterfactual
// replay. The variant resumes from its checkpoint at STEP with the axes --set changed (none: the same
// variant, which must come back bit for bit), reads the same batches (the data cursor of the
// checkpoint), and trains K steps (default: to the original's last step). Per step it records the
// loss beside the original's, and at every step where the original has a checkpoint the whole-model
// W1 and max |dW| between the two; it says whether the original's loss spikes and divergence in that
// range come back (the trainer's own spike rule, [train] spike_window and spike_threshold).
//
// Output: OUT/replays/<ID>-from<STEP>[+AXIS=VALUE...]/ with train_log.csv (the trainer's log) and
// replay.csv (step, loss, original_loss, spike, original_spike, skipped, original_skipped,
// diverged, original_diverged, w1, max_abs; w1 and max_abs empty where the original has no
// checkpoint). The replay runs on one process; a variant whose group averages over several ranks
// without dp_width cannot be replayed bit for bit and is refused.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <boost/program_options.hpp>

#include "analysis/distance.hpp"
#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/manifest.hpp"
#include "base/number.hpp"
#include "jobs/collective.hpp"
#include "jobs/explain_common.hpp"
#include "jobs/job.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/explain.hpp"
#include "src/train/trainer.hpp"

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace fastudy {
namespace {

// One row of a train_log.csv.
struct LogRow {
  double loss = NAN;
  bool skipped = false, spike = false;
};

// The original's train_log.csv by step (empty when it has none).
std::map<std::int64_t, LogRow> read_train_log(const std::string& path) {
  std::map<std::int64_t, LogRow> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header: step,loss,grad_norm,lr,loss_scale,skipped,spike,tokens_per_s
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    if (f.size() < 7) continue;
    LogRow r;
    r.loss = std::strtod(f[1].c_str(), nullptr);
    r.skipped = f[5] == "1";
    r.spike = f[6] == "1";
    rows[std::stoll(f[0])] = r;
  }
  return rows;
}

// All parameters of a state, widened to double, in order.
std::vector<double> flat_params(const std::vector<NamedArray>& params) {
  std::vector<double> out;
  for (const NamedArray& a : params) {
    const std::int64_t n = a.numel();
    for (std::int64_t i = 0; i < n; ++i) out.push_back(a.dtype == DType::f64 ? a.as<double>()[i] : a.as<float>()[i]);
  }
  return out;
}

struct Distance {
  double w1 = NAN, max_abs = NAN;
};

Distance weight_distance(const std::vector<NamedArray>& a, const std::vector<NamedArray>& b) {
  const std::vector<double> x = flat_params(a), y = flat_params(b);
  Distance d;
  d.max_abs = 0;
  bool finite = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) finite = false;
    else d.max_abs = std::max(d.max_abs, std::fabs(x[i] - y[i]));
  }
  if (finite) d.w1 = wasserstein1(ArrayView<double>(x), ArrayView<double>(y));
  else d.max_abs = INFINITY;
  return d;
}

std::vector<std::pair<std::string, std::string>> parse_sets(const std::vector<std::string>& sets) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& s : sets) {
    const std::size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      throw UsageError("--set " + s + ": expected AXIS=VALUE", "e.g. --set precision=bf16 --set policy=mixed");
    for (const auto& [axis, value] : out)
      if (axis == s.substr(0, eq)) throw UsageError("--set names " + axis + " twice", "set each axis once");
    out.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  return out;
}

// A cell: empty where the run has no such step (a diverged run ends early).
std::string cell(bool present, double x) { return present ? number_text(x, 9) : ""; }

}  // namespace

void replay_options(po::options_description& d, CliOptions& o) {
  d.add_options()("variant", po::value<std::vector<std::string>>(&o.replay.variants), "the variant to replay (its id)")(
      "from", po::value<std::int64_t>(&o.replay.from_step), "resume from the variant's checkpoint at this step (0: its initial weights)")(
      "steps", po::value<std::int64_t>(&o.replay.steps), "steps to replay (default: to the original's last step)")(
      "set", po::value<std::vector<std::string>>(&o.replay.sets),
      "AXIS=VALUE: run with this grid axis changed (repeatable; none: the original again, bit for bit)");
}

int job_replay(JobContext& ctx) {
  const Study& st = *ctx.study;
  const std::string out = ctx.out_dir;
  if (ctx.opts.replay.variants.size() > 1) throw UsageError("--variant names one variant to replay", "pass --variant once");
  const Variant& orig = named_variant(st, "--variant", ctx.opts.replay.variants.empty() ? "" : ctx.opts.replay.variants[0]);
  const std::int64_t from = ctx.opts.replay.from_step;
  const Variant v = variant_with(st, orig, parse_sets(ctx.opts.replay.sets));
  if (orig.train.dp_width == 0 && orig.train.ranks_per_variant > 1)
    throw UsageError("--variant " + orig.id + " trained on groups of " + std::to_string(orig.train.ranks_per_variant) +
                         " ranks averaged by the MPI/NCCL allreduce, which a replay on one process cannot repeat bit for bit",
                     "set [train] dp_width to model the data-parallel width (the same bits on any rank count)");
  const std::int64_t steps = ctx.opts.replay.steps > 0 ? ctx.opts.replay.steps : orig.train.steps - std::max<std::int64_t>(from, 0);
  if (ctx.opts.replay.steps < 0 || (from >= 0 && from + steps > orig.train.steps))
    throw UsageError("--steps " + std::to_string(ctx.opts.replay.steps) + ": the original trained to step " + std::to_string(orig.train.steps),
                     "replay at most " + std::to_string(orig.train.steps - std::max<std::int64_t>(from, 0)) + " steps from step " +
                         std::to_string(from));
  TrainState start = replay_state(v, state_at(out, orig, from, "--from"));
  const std::int64_t last = from + steps;

  std::string name = orig.id + "-from" + std::to_string(from);
  for (const auto& [axis, value] : parse_sets(ctx.opts.replay.sets)) name += "+" + axis + "=" + value;
  const std::string rel = "replays/" + name;
  const std::string dir = (fs::path(out) / rel).string();
  manifest::add(out, {{manifest::Kind::dir, "replay", rel},
                      {manifest::Kind::file, "replay", rel + "/train_log.csv"},
                      {manifest::Kind::file, "replay", rel + "/shadow.csv"},
                      {manifest::Kind::file, "replay", rel + "/replay.csv"}});
  fs::create_directories(dir);

  const std::map<std::int64_t, LogRow> original = read_train_log((fs::path(out) / "variants" / orig.id / "train_log.csv").string());
  const std::vector<std::int64_t> ckpts = list_checkpoint_steps(checkpoint_dir(out, orig.id));
  log::info("replay " + orig.id + " from step " + std::to_string(from) + " for " + std::to_string(steps) + " steps" +
            (ctx.opts.replay.sets.empty() ? std::string(" (no axis changed: must repeat the original bit for bit)") : " as " + v.id) +
            " into " + dir);

  std::map<std::int64_t, LogRow> replayed;
  std::map<std::int64_t, Distance> distances;
  std::int64_t done_step = from;
  TrainHooks hooks;
  hooks.on_step = [&](const StepLog& l) {
    done_step = l.step;
    replayed[l.step] = {l.loss, l.skipped, l.spike};
  };
  hooks.save_checkpoint = [&](const TrainState& s) {
    if (std::find(ckpts.begin(), ckpts.end(), s.step) == ckpts.end()) return;
    distances[s.step] = weight_distance(s.params, read_params(checkpoint_path(out, orig.id, s.step)));
  };
  hooks.stop_requested = [&] { return done_step >= last || stop_signal_received(); };
  const TrainResult r = train_variant(v, dir, hooks, &start);
  const bool diverged = r.outcome == TrainOutcome::diverged;
  if (diverged) replayed[r.step + 1] = {r.final_loss, false, false};

  // The original diverged where its log ends on a non-finite loss.
  std::int64_t original_diverged = 0;
  for (const auto& [step, row] : original)
    if (step > from && step <= last && !std::isfinite(row.loss)) original_diverged = step;

  std::ostringstream csv;
  csv << ctx.prov.header();
  csv << "step,loss,original_loss,spike,original_spike,skipped,original_skipped,diverged,original_diverged,w1,max_abs\n";
  int orig_spikes = 0, replay_spikes = 0, identical_losses = 0, compared_losses = 0;
  std::ostringstream table;
  table << "  step  loss (original)     loss (replay)       W1 to original  max |dW|\n";
  for (std::int64_t s = from + 1; s <= last; ++s) {
    const auto o = original.find(s);
    const auto p = replayed.find(s);
    if (p == replayed.end() && o == original.end()) continue;
    const LogRow orow = o != original.end() ? o->second : LogRow{};
    const LogRow prow = p != replayed.end() ? p->second : LogRow{};
    const bool p_div = diverged && s == r.step + 1;
    const bool o_div = s == original_diverged;
    orig_spikes += orow.spike;
    replay_spikes += prow.spike;
    if (o != original.end() && p != replayed.end()) {
      ++compared_losses;
      identical_losses += number_text(orow.loss, 9) == number_text(prow.loss, 9);
    }
    const auto d = distances.find(s);
    const bool measured = d != distances.end();
    csv << s << ',' << cell(p != replayed.end(), prow.loss) << ',' << cell(o != original.end(), orow.loss) << ','
        << prow.spike << ',' << orow.spike << ',' << prow.skipped << ',' << orow.skipped << ',' << p_div << ',' << o_div << ','
        << cell(measured, measured ? d->second.w1 : 0) << ',' << cell(measured, measured ? d->second.max_abs : 0) << '\n';
    if (measured || prow.spike || orow.spike || p_div || o_div) {
      auto loss_text = [](bool present, const LogRow& row, bool div) {
        return present ? number_text(row.loss, 9) + (row.spike ? " spike" : div ? " diverged" : "") : std::string("-");
      };
      char line[160];
      std::snprintf(line, sizeof line, "  %4lld  %-18s  %-18s  %-14s  %s\n", static_cast<long long>(s),
                    loss_text(o != original.end(), orow, o_div).c_str(), loss_text(p != replayed.end(), prow, p_div).c_str(),
                    measured ? number_text(d->second.w1, 9).c_str() : "-", measured ? number_text(d->second.max_abs, 9).c_str() : "-");
      table << line;
    }
  }
  atomic_write_sealed((fs::path(dir) / "replay.csv").string(), csv.str());
  log::info(table.str());

  bool weights_equal = !distances.empty();
  for (const auto& [step, d] : distances) weights_equal = weights_equal && d.max_abs == 0;
  std::ostringstream verdict;
  verdict << "replay: " << (diverged ? "diverged at step " + std::to_string(r.step + 1) : "ran to step " + std::to_string(r.step)) << "; ";
  verdict << "original: " << orig_spikes << " loss spike(s)" << (original_diverged ? ", diverged at step " + std::to_string(original_diverged) : "")
          << " in steps " << from + 1 << "-" << last << ", replay: " << replay_spikes << " spike(s)" << (diverged ? ", diverged" : "");
  const bool trouble_before = orig_spikes > 0 || original_diverged;
  const bool trouble_after = replay_spikes > 0 || diverged;
  if (trouble_before) verdict << (trouble_after ? " -> it comes back" : " -> it does not come back");
  if (weights_equal && identical_losses == compared_losses) verdict << "; bit-identical to the original (weights at every checkpoint, every loss)";
  log::info(verdict.str());
  log::info("replay: wrote " + (fs::path(dir) / "replay.csv").string());
  return kExitOk;
}

}  // namespace fastudy
