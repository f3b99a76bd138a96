// The output directory policy: create, refuse, resume, or redo a job (--force: only the files fastudy
// wrote, as its manifest lists them).
#include <algorithm>
#include <fstream>
#include <optional>
#include <filesystem>
#include <sstream>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/manifest.hpp"
#include "base/read_file.hpp"
#include "base/error.hpp"
#include "jobs/job.hpp"
#include "jobs/study_lock.hpp"

namespace fs = std::filesystem;

namespace fastudy {

const char* const kStudyTomlHint =
    "study.toml was changed or damaged after fastudy wrote it; restore it, or start the study again in "
    "another --out (or with `fastudy GRID --out OUT --force`, which deletes only the files fastudy wrote there)";

bool file_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string read_text_file(const std::string& path) {
  // A study's text outputs are far smaller; a larger file in their place is not read into memory.
  constexpr std::size_t kMaxTextBytes = std::size_t{1} << 30;
  std::string problem;
  std::optional<std::string> text = read_regular_file(path, kMaxTextBytes, &problem);
  if (!text) throw Error("cannot read " + path + ": it " + problem, "check that the file exists and is readable");
  return std::move(*text);
}

namespace {
// The study lock (and the temporary names of its creation) is not an output: it does not make a
// directory non-empty and --force keeps it.
bool is_lock_file(const fs::path& p) { return p.filename().string().rfind(kLockName, 0) == 0; }

bool empty_but_lock(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!is_lock_file(e.path())) return false;
  return true;
}

// OUT/variants.csv: every variant of the grid with its value of every axis (columns in grid order),
// written with study.toml, so that readers (the report) never re-implement the grid's expansion.
void write_variants_csv(const fs::path& out, const Study& st) {
  std::ostringstream os;
  os << "variant,hash";
  for (const auto& axis : st.axes) os << ',' << csv_field(axis.first);
  os << '\n';
  for (const auto& v : st.variants) {
    os << csv_field(v.id) << ',' << v.hash;
    for (const auto& [axis, value] : v.axes) os << ',' << csv_field(value);
    os << '\n';
  }
  atomic_write_sealed((out / "variants.csv").string(), os.str());
}

// The files a job writes at fixed names in OUT, as manifest entries, registered before it runs
// (train's per-variant files and the report's plots are added by those jobs, which know the names).
// `run` writes those of every phase its grid enables; every job that prepares the study writes
// study.toml, variants.csv and provenance.txt (job "study").
std::vector<manifest::Entry> outputs_of(const std::string& job) {
  using manifest::Kind;
  static const std::vector<manifest::Entry> kOutputs = {
      {Kind::file, "study", "study.toml"},          {Kind::file, "study", "variants.csv"},
      {Kind::file, "study", "provenance.txt"},      {Kind::file, "microbench", "microbench.csv"},
      {Kind::file, "microbench", "microbench.h5"},  {Kind::file, "microbench", "microbench_outputs.h5"},
      {Kind::file, "train", "status.csv"},
      {Kind::dir, "train", "checkpoints"},          {Kind::dir, "train", "variants"},
      {Kind::file, "reduce", "deviation.h5"},       {Kind::file, "reduce", "deviation.csv"},
      {Kind::file, "reduce", "axes.csv"},           {Kind::file, "reduce", "ranking.csv"},
      {Kind::file, "reduce", "verdict.csv"},        {Kind::file, "reduce", "twins.csv"},
      {Kind::file, "report", "report.html"},        {Kind::file, "report", "report.md"},
      {Kind::dir, "report", "report_files"},        {Kind::scratch, "report", "report.staging"},
      {Kind::file, "slurm", "fastudy.sbatch"},      {Kind::dir, "replay", "replays"},
      {Kind::dir, "bisect", "bisect"},             {Kind::file, "advise", "advice.csv"}};
  std::vector<manifest::Entry> out;
  for (const auto& e : kOutputs)
    if (e.job == job) out.push_back(e);
  return out;
}

std::vector<manifest::Entry> job_outputs(const JobContext& ctx) {
  std::vector<manifest::Entry> out = outputs_of("study");
  std::vector<std::string> jobs{ctx.opts.command};
  if (ctx.opts.command == "run") jobs = ctx.study->phases;
  for (const auto& job : jobs)
    for (auto& e : outputs_of(job)) out.push_back(std::move(e));
  return out;
}

std::string force_meaning(const std::string& job) {
  return job == "run" ? std::string("start the study over (deletes every file fastudy wrote there, nothing else)")
                      : "redo `" + job + "` (deletes the files `" + job + "` wrote there, nothing else)";
}

UsageError no_manifest(const std::string& out) {
  return UsageError("--force: " + out + " holds a study without " + manifest::kName +
                        " (written before fastudy kept one, or study.toml is not fastudy's), so fastudy cannot tell "
                        "the files it wrote from others and deletes nothing",
                    "remove the study's files yourself if you mean to start over, or choose another --out; "
                    "--resume continues the study and begins its manifest");
}

}  // namespace

void prepare_output(JobContext& ctx) {
  const Study& st = *ctx.study;
  const fs::path out(ctx.out_dir);
  const fs::path marker = out / "study.toml";
  std::error_code ec;
  bool exists = fs::exists(out, ec);
  bool empty = exists && fs::is_directory(out, ec) && empty_but_lock(out);
  if (exists && !fs::is_directory(out, ec))
    throw UsageError("output path " + out.string() + " exists and is not a directory", "choose another --out");

  if (exists && !empty) {
    const bool listed = fs::exists(fs::symlink_status(manifest::path_of(out.string())));
    if (!fs::exists(marker) && !(listed && ctx.opts.force)) {
      throw UsageError("output directory " + out.string() + " is not empty and holds no fastudy study (no study.toml)",
                       "choose another --out; fastudy never deletes files it did not write");
    } else if (ctx.opts.force && !ctx.opts.resume) {
      // open_study has deleted what this job wrote before (or refused): only a study with a manifest
      // gets here, and it is written again as a new one.
      if (!manifest::read(out.string())) throw no_manifest(out.string());
    } else if (ctx.opts.resume) {
      // open_study has compared the configurations (check_configuration): the study goes on.
    } else {
      throw UsageError("output directory " + out.string() + " already holds a study",
                       "pass --resume to continue it, --force to " + force_meaning(ctx.opts.command) + ", or --out DIR");
    }
  }
  fs::create_directories(out, ec);
  if (ec) throw Error("cannot create output directory " + out.string() + ": " + ec.message(),
                      "check the path and permissions, or pass --out DIR");
  // What fastudy writes, it reads back: study.toml is parsed again before it is written, so that no
  // value the reader refuses leaves a study that no command can open.
  std::string unreadable;
  try {
    if (parse_study(st.resolved_toml, marker.string()).hash != st.hash) unreadable = "it reads back as another configuration";
  } catch (const ConfigError& e) {
    unreadable = e.what();
  }
  if (!unreadable.empty())
    throw Error("fastudy would write a study.toml that it cannot read back (" + one_line(unreadable) + "); nothing was written",
                "this is a bug in fastudy: please report it with the grid file");
  manifest::add(out.string(), job_outputs(ctx));
  atomic_write_sealed(marker.string(), st.resolved_toml);
  write_variants_csv(out, st);
  atomic_write((out / "provenance.txt").string(), ctx.prov.header());
}

void keep_study_record(JobContext& ctx) {
  const fs::path marker = fs::path(ctx.out_dir) / "study.toml";
  std::error_code ec;
  if (!ctx.study || ctx.study->file == marker.string() || !fs::is_regular_file(marker, ec) || checksum_problem(marker.string()))
    return;
  try {
    const Study previous = parse_study(read_sealed(marker.string(), kStudyTomlHint), marker.string());
    if (previous.hash == ctx.study->hash || !configuration_differences(previous, *ctx.study).empty()) return;
    ctx.study->out = previous.out;
    ctx.study->resolved_toml = previous.resolved_toml;
    ctx.study->hash = previous.hash;
  } catch (const ConfigError&) {
    // a study.toml this fastudy cannot read: the job that opens the study names it
  }
}

namespace {

// A job writes into an existing study only with the study's configuration (its study.toml, compared
// setting by setting: configuration_differences), so that every result in a study is of the
// configuration study.toml states. Two jobs may change it: `run --force` starts the study over (every
// file fastudy wrote is deleted first), and `train` or `run` with `--resume --force` trains the variants
// whose configuration changed again from scratch. Anything else is a UsageError naming the settings
// that differ (and the variants they change), before anything is deleted or written.
void check_configuration(const JobContext& ctx) {
  const Study& st = *ctx.study;
  const fs::path marker = fs::path(ctx.out_dir) / "study.toml";
  std::error_code ec;
  if (!fs::is_regular_file(marker, ec) || checksum_problem(marker.string())) return;  // not a study fastudy wrote
  const Study previous = parse_study(read_sealed(marker.string(), kStudyTomlHint), marker.string());
  const std::vector<std::string> differences = configuration_differences(previous, st);
  if (differences.empty()) return;
  const std::string& job = ctx.opts.command;
  if (job == "run" && ctx.opts.force && !ctx.opts.resume) return;  // starts the study over
  std::vector<std::string> changed;
  for (const auto& v : st.variants) {
    const Variant* before = previous.find_variant(v.id);
    if (before && before->hash != v.hash) changed.push_back(v.id);
  }
  constexpr std::size_t kNamed = 6;  // settings and variants named in the message (the count says the rest)
  const auto named = [&](const std::vector<std::string>& items) {
    std::string out;
    for (std::size_t i = 0; i < items.size() && i < kNamed; ++i) out += (i ? "; " : "") + items[i];
    if (items.size() > kNamed) out += "; and " + std::to_string(items.size() - kNamed) + " more";
    return out;
  };
  const std::string what = std::to_string(differences.size()) + " setting(s) differ: " + named(differences) +
                           (changed.empty() ? std::string()
                                            : " (the training of " + std::to_string(changed.size()) + " variant(s) changes: " +
                                                  named(changed) + ")");
  if ((job == "train" || job == "run") && ctx.opts.force && ctx.opts.resume) {
    log::warn("the configuration of " + st.file + " is not the one in " + marker.string() + ": " + what +
              "; --resume --force trains the changed variants again from scratch and writes the new study.toml");
    return;
  }
  const std::string grid = shell_quote(st.file), out = shell_quote(ctx.out_dir);
  throw UsageError(ctx.out_dir + " holds a study of another configuration than " + st.file + ": " + what,
                   "use the study's own configuration (fastudy " + job + " " + shell_quote(marker.string()) + " --out " + out +
                       " ...), retrain what changed with `fastudy train " + grid + " --out " + out +
                       " --resume --force`, start over with `fastudy " + grid + " --out " + out +
                       " --force` (deletes every file fastudy wrote there), or choose another --out");
}

}  // namespace

void open_study(JobContext& ctx) {
  const std::string out = ctx.out_dir;
  std::error_code ec;
  const bool study = fs::is_directory(out, ec) && (fs::exists(fs::path(out) / "study.toml", ec) ||
                                                    fs::exists(fs::symlink_status(manifest::path_of(out), ec)));
  if (!study) return;  // a new study: prepare_output writes its manifest; a folder that is none: refused there
  check_configuration(ctx);
  if (ctx.opts.force && !ctx.opts.resume) {
    std::optional<std::vector<manifest::Entry>> listed;
    try {
      listed = manifest::read(out);
    } catch (const Error& e) {
      throw UsageError(
          std::string("--force: ") + e.what() +
              "; fastudy cannot tell the files it wrote from others and deletes nothing",
          "restore " + manifest::path_of(out) + ", or remove the study's files yourself, or choose another --out");
    }
    if (!listed) throw no_manifest(out);
    const bool all = ctx.opts.command == "run";
    // `train --variant V --force`: only those variants' files; the others' results and the study's
    // state stay, and the job continues the study (as --resume) with those variants from scratch.
    const std::vector<std::string> only = ctx.opts.command == "train" ? ctx.opts.train.variants : std::vector<std::string>{};
    const auto of_variant = [&](const manifest::Entry& e) {
      return std::any_of(only.begin(), only.end(), [&](const std::string& id) {
        for (const std::string& dir : {"variants/" + id, "checkpoints/" + id})
          if (e.path == dir || e.path.rfind(dir + "/", 0) == 0) return true;
        return false;
      });
    };
    const manifest::Removal r = manifest::remove(out, [&](const manifest::Entry& e) {
      return all || (e.job == ctx.opts.command && (only.empty() || of_variant(e)));
    });
    std::string whose = all ? std::string("fastudy") : ctx.opts.command;
    for (std::size_t i = 0; i < only.size(); ++i) whose += (i ? ", " : " --variant ") + only[i];
    log::info("--force: deleted " + std::to_string(r.removed.size()) + " file(s) and folder(s) that `" + whose +
              "` wrote in " + out + " (listed in " + manifest::path_of(out) + ")");
    if (!only.empty()) ctx.opts.resume = true;
    for (const auto& k : r.kept)
      log::warn("--force: kept " + (fs::path(out) / k).string() + ": it is not what fastudy wrote there");
    std::vector<std::string> theirs;
    for (const auto& rel : manifest::unlisted(out, manifest::read(out).value_or(std::vector<manifest::Entry>{})))
      if (!is_lock_file(rel) && (theirs.empty() || rel.rfind(theirs.back() + "/", 0) != 0)) theirs.push_back(rel);
    if (!theirs.empty()) {
      std::string names;
      for (std::size_t i = 0; i < theirs.size() && i < 8; ++i) names += (i ? ", " : "") + theirs[i];
      if (theirs.size() > 8) names += ", ...";
      log::info("--force: kept " + std::to_string(theirs.size()) + " item(s) fastudy did not write: " + names);
    }
    manifest::add(out, job_outputs(ctx));  // what the job writes again
    return;
  }
  // Only a study fastudy wrote (its study.toml matches its checksum) gets entries; anything else is
  // refused by the job before it writes.
  if (!checksum_problem((fs::path(out) / "study.toml").string())) manifest::add(out, job_outputs(ctx));
}

}  // namespace fastudy
