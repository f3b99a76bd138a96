// `fastudy slurm GRID.toml --nodes N --ntasks-per-node T --time HH:MM:SS [--submit]`: write an sbatch
// script for the study into its output directory (OUT/fastudy.sbatch) and, with --submit, hand it to
// sbatch.
//
// The script survives time limits: Slurm sends the batch shell SIGUSR1 some minutes before the limit
// (--signal=B:USR1@lead), the shell forwards it to fastudy, which checkpoints at the next step and exits
// with code 1; the shell then requeues the job (scontrol requeue, --requeue), and the next run continues
// the study with --resume. The script is slurm/fastudy.sbatch.in with its @FIELD@s filled in and its
// own comment replaced by a header on the study; the build embeds the template into the binary
// (cmake/EmbedFile.cmake -> fastudy/sbatch_template.hpp), so nothing is read from the source tree.
//
// The output directory is prepared like any phase does it (study.toml, provenance.txt), so that
// `fastudy GRID.toml --out OUT --resume` and the job's own `--resume` both find a study there.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <boost/program_options.hpp>

#include "base/atomic_file.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "fastudy/sbatch_template.hpp"
#include "jobs/estimate.hpp"
#include "jobs/job.hpp"

namespace fs = std::filesystem;

namespace po = boost::program_options;

namespace fastudy {

namespace {

// Seconds of D-HH:MM:SS or HH:MM:SS; UsageError for anything else.
long parse_time_limit(const std::string& t) {
  const std::string hint = "give the time limit as HH:MM:SS or D-HH:MM:SS, e.g. --time 02:00:00 or --time 1-12:00:00";
  const auto bad = [&](const std::string& why) { return UsageError("--time " + t + ": " + why, hint); };
  const auto digits = [](const std::string& f) {
    return std::all_of(f.begin(), f.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
  };
  std::string rest = t;
  long days = 0;
  bool has_days = false;
  if (auto dash = rest.find('-'); dash != std::string::npos) {
    const std::string d = rest.substr(0, dash);
    if (d.empty() || d.size() > 3 || !digits(d)) throw bad("the days are not a number");
    days = std::stol(d);
    has_days = true;
    rest = rest.substr(dash + 1);
  }
  long parts[3];
  std::size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t end = i < 2 ? rest.find(':', pos) : rest.size();
    if (end == std::string::npos) throw bad("expected three fields separated by ':'");
    const std::string f = rest.substr(pos, end - pos);
    if (f.empty() || f.size() > (i == 0 && !has_days ? 4u : 2u) || !digits(f))
      throw bad("field '" + f + "' is not a number of " + (i == 0 && !has_days ? "1-4" : "1-2") + " digits");
    parts[i] = std::stol(f);
    pos = end + 1;
  }
  if (parts[1] >= 60 || parts[2] >= 60) throw bad("minutes and seconds must be below 60");
  if (has_days && parts[0] >= 24) throw bad("hours must be below 24 when days are given");
  const long seconds = ((days * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2];
  if (seconds <= 0) throw bad("the time limit must be positive");
  return seconds;
}

// How long before the time limit Slurm sends the warning signal: 10% of the limit, at least a minute
// (a checkpoint of a large model must fit in it), at most ten minutes (no point idling longer), and
// never more than half the limit.
long warning_lead_seconds(long limit) { return std::min(std::clamp(limit / 10, 60L, 600L), limit / 2); }

// Slurm names (partition, account): letters, digits and _ . - , only, so they go into the script as is.
void check_slurm_name(const std::string& what, const std::string& value) {
  const bool ok = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ',';
  });
  if (!ok) throw UsageError("--" + what + " '" + value + "' is not a Slurm name", "use letters, digits, _ . - and , only");
}

// The study's name as the job name's part after "fastudy-": other characters than letters, digits and
// - _ . become _.
std::string job_name_part(const std::string& study) {
  std::string n;
  for (char c : study) n += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  return n;
}

// The path of the running fastudy, so that the job runs the same one that wrote the script: the
// `fastudy` launcher beside this program (jobs/launcher.cpp) where there is one, else this program.
std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "fastudy";
  const fs::path launcher = p.parent_path() / "fastudy";
  return ::access(launcher.c_str(), X_OK) == 0 ? launcher.string() : p.string();
}

// One @NAME@ field of the template and its text in the script.
struct TemplateField {
  std::string name;
  std::string value;
};

// Whether `text` holds a field at `at`: '@', one or more of A-Z and _, '@'. Returns its length, or 0.
std::size_t field_length_at(std::string_view text, std::size_t at) {
  if (text[at] != '@') return 0;
  std::size_t end = at + 1;
  while (end < text.size() && (std::isupper(static_cast<unsigned char>(text[end])) || text[end] == '_')) ++end;
  return end > at + 1 && end < text.size() && text[end] == '@' ? end + 1 - at : 0;
}

// slurm/fastudy.sbatch.in filled in: its #! line, `header` in place of the template's own comment (up
// to the first #SBATCH line), then the rest with every @NAME@ replaced by its value in one pass (a
// value is never scanned for fields). An #SBATCH line with a field whose value is empty is left out
// (--gpus-per-node 0, no --partition or --account). Every field must be known: a field the template
// has and fastudy does not fill is an Error, not a script with a literal @NAME@ in it.
std::string fill_sbatch_template(std::string_view templ, const std::string& header,
                                 const std::vector<TemplateField>& fields) {
  const std::size_t shebang_end = templ.find('\n');
  const std::size_t sbatch_at = templ.find("\n#SBATCH ");
  if (templ.rfind("#!", 0) != 0 || sbatch_at == std::string_view::npos)
    throw Error("fastudy's built-in sbatch template has no #! line or no #SBATCH line",
                "slurm/fastudy.sbatch.in must open with #!/bin/bash and hold the #SBATCH lines; fix it and rebuild");
  std::string script(templ.substr(0, shebang_end + 1));
  script += header;
  std::size_t line_start = sbatch_at + 1;
  while (line_start < templ.size()) {
    std::size_t line_end = templ.find('\n', line_start);
    line_end = line_end == std::string_view::npos ? templ.size() : line_end + 1;
    const std::string_view line = templ.substr(line_start, line_end - line_start);
    line_start = line_end;
    std::string filled;
    bool drop = false;
    for (std::size_t i = 0; i < line.size();) {
      const std::size_t n = field_length_at(line, i);
      if (n == 0) {
        filled += line[i++];
        continue;
      }
      const std::string_view name = line.substr(i + 1, n - 2);
      const auto f = std::find_if(fields.begin(), fields.end(), [&](const TemplateField& t) { return t.name == name; });
      if (f == fields.end())
        throw Error("fastudy's built-in sbatch template has the field @" + std::string(name) +
                        "@, which fastudy slurm does not fill",
                    "fill it in jobs/slurm.cpp (sbatch_script) or remove it from slurm/fastudy.sbatch.in, and rebuild");
      drop = drop || (f->value.empty() && line.rfind("#SBATCH", 0) == 0);
      filled += f->value;
      i += n;
    }
    if (!drop) script += filled;
  }
  return script;
}

std::string sbatch_script(const JobContext& ctx, const std::string& grid, const std::string& out, long limit) {
  const Study& st = *ctx.study;
  const SlurmOptions& s = ctx.opts.slurm;
  const int ranks = s.nodes * s.ntasks_per_node;
  const int rpv = st.train.ranks_per_variant;
  const long lead = warning_lead_seconds(limit);

  double ckpt_total = 0;
  for (const auto& v : st.variants) {
    const VariantEstimate e = estimate_variant(v);
    ckpt_total += e.checkpoint_bytes * static_cast<double>(e.checkpoints);
  }
  const VariantEstimate first = estimate_variant(st.variants.front());

  // The header on what the job will do, in place of the template's own comment. Every value from the
  // grid or the command line is a one-line shell word (shell_quote), so no name or path can end a
  // comment line and put a command (or a line before the #SBATCH lines) into the script.
  std::ostringstream os;
  os << "# fastudy sbatch script for study " << shell_quote(st.name) << ", written by fastudy slurm (fastudy "
     << ctx.prov.version << ").\n";
  os << "#   grid:        " << shell_quote(grid) << " (config hash " << st.hash << ")\n";
  os << "#   output:      " << shell_quote(out) << "\n";
  os << "#   phases:      ";
  for (std::size_t i = 0; i < st.phases.size(); ++i) os << (i ? ", " : "") << st.phases[i];
  os << "\n#   variants:    " << st.variants.size() << " (" << grid_shape(st) << ")\n";
  os << "#   ranks:       " << ranks << " = " << s.nodes << " node(s) x " << s.ntasks_per_node << " task(s)";
  if (s.gpus_per_node > 0) os << ", " << s.gpus_per_node << " GPU(s) per node";
  if (s.cpus_per_task > 0) os << ", " << s.cpus_per_task << " CPU(s) each (its training threads)";
  os << "\n#   groups:      " << ranks / rpv << " of " << rpv << " rank(s) (ranks_per_variant), variants scheduled dynamically\n";
  os << "#   checkpoints: about " << human_bytes(ckpt_total) << " in total (" << human_bytes(first.checkpoint_bytes)
     << " each, " << first.checkpoints << " per variant)\n";
  os << "#   memory:      about " << human_bytes(first.memory_per_rank) << " per rank while training\n";
  os << "#   time limit:  " << s.time << "; SIGUSR1 " << lead << " s before it: fastudy checkpoints, the job\n"
     << "#                requeues itself and the next run resumes (--resume)\n";
  os << "# Submit: sbatch " << shell_quote(out + "/fastudy.sbatch") << "   Progress: fastudy status " << shell_quote(out)
     << "\n";
  os << "# Regenerate: " << ctx.opts.command_line << "\n";
  const std::string header = os.str();
  for (std::size_t at = 0; at < header.size(); at = header.find('\n', at) + 1)
    if (header[at] != '#') throw std::logic_error("fastudy slurm: a header line of the script is not a comment: " + header);
  return fill_sbatch_template(embedded::kSbatchTemplate, header,
                              {{"STUDY", job_name_part(st.name)},
                               {"NODES", std::to_string(s.nodes)},
                               {"TASKS_PER_NODE", std::to_string(s.ntasks_per_node)},
                               {"GPUS_PER_NODE", s.gpus_per_node > 0 ? std::to_string(s.gpus_per_node) : ""},
                               {"CPUS_PER_TASK", s.cpus_per_task > 0 ? std::to_string(s.cpus_per_task) : ""},
                               {"TIME", s.time},
                               {"PARTITION", s.partition},
                               {"ACCOUNT", s.account},
                               {"OUT", out},
                               {"LEAD", std::to_string(lead)},
                               {"FASTUDY_QUOTED", shell_quote(self_executable())},
                               {"GRID_QUOTED", shell_quote(grid)},
                               {"OUT_QUOTED", shell_quote(out)},
                               {"LAUNCHER", s.launcher}});
}

// Whether an executable named `name` is on PATH.
bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string d;
  while (std::getline(dirs, d, ':')) {
    if (d.empty()) continue;
    const std::string p = d + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Runs `sbatch --parsable SCRIPT` (fork/exec, no shell); returns the job id. Throws Error on failure.
std::string submit_script(const std::string& script) {
  if (!on_path("sbatch"))
    throw Error("sbatch is not on PATH, so the job cannot be submitted from here (the script is written: " + script + ")",
                "run `sbatch " + script + "` on a machine with Slurm's client commands (a login node), or install "
                "them (Debian: slurm-client)");
  int fds[2];
  if (::pipe(fds) != 0) throw Error(std::string("pipe failed: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const char* argv[] = {"sbatch", "--parsable", script.c_str(), nullptr};
    ::execvp("sbatch", const_cast<char* const*>(argv));
    std::fprintf(stderr, "cannot run sbatch: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("sbatch " + script + " failed: " + output,
                "check the partition, account and limits in the message; the script stays in place for `sbatch` by hand");
  // --parsable prints "jobid" or "jobid;cluster" (after any warnings on earlier lines).
  const std::size_t last_line = output.find_last_of('\n');
  std::string id = output.substr(last_line == std::string::npos ? 0 : last_line + 1);
  return id.substr(0, id.find(';'));
}

}  // namespace

void slurm_options(po::options_description& d, CliOptions& o) {
  d.add_options()("nodes", po::value<int>(&o.slurm.nodes)->default_value(1), "nodes")(
      "ntasks-per-node", po::value<int>(&o.slurm.ntasks_per_node)->default_value(1), "MPI ranks per node")(
      "gpus-per-node", po::value<int>(&o.slurm.gpus_per_node)->default_value(0), "GPUs per node (one rank per GPU)")(
      "cpus-per-task", po::value<int>(&o.slurm.cpus_per_task)->default_value(0),
      "CPUs per rank, its training threads (0: Slurm's default, one)")(
      "time", po::value<std::string>(&o.slurm.time)->default_value("01:00:00"), "time limit HH:MM:SS")(
      "partition", po::value<std::string>(&o.slurm.partition), "Slurm partition")(
      "account", po::value<std::string>(&o.slurm.account), "Slurm account")(
      "launcher", po::value<std::string>(&o.slurm.launcher)->default_value("srun"), "srun or mpirun")(
      "submit", po::bool_switch(&o.slurm.submit), "submit the script with sbatch after writing it");
}

int job_slurm(JobContext& ctx) {
  const Study& st = *ctx.study;
  const SlurmOptions& s = ctx.opts.slurm;

  // Everything is validated before anything is written.
  if (s.nodes < 1) throw UsageError("--nodes must be >= 1 (got " + std::to_string(s.nodes) + ")");
  if (s.ntasks_per_node < 1)
    throw UsageError("--ntasks-per-node must be >= 1 (got " + std::to_string(s.ntasks_per_node) + ")");
  if (s.gpus_per_node < 0) throw UsageError("--gpus-per-node must be >= 0 (got " + std::to_string(s.gpus_per_node) + ")");
  if (s.cpus_per_task < 0) throw UsageError("--cpus-per-task must be >= 0 (got " + std::to_string(s.cpus_per_task) + ")");
  if (s.launcher != "srun" && s.launcher != "mpirun")
    throw UsageError("--launcher " + s.launcher + " is not known", "use --launcher srun or --launcher mpirun");
  const long limit = parse_time_limit(s.time);
  if (!s.partition.empty()) check_slurm_name("partition", s.partition);
  if (!s.account.empty()) check_slurm_name("account", s.account);
  const int ranks = s.nodes * s.ntasks_per_node;
  const int rpv = st.train.ranks_per_variant;
  if (ranks % rpv != 0)
    throw UsageError(std::to_string(s.nodes) + " node(s) x " + std::to_string(s.ntasks_per_node) + " task(s) = " +
                         std::to_string(ranks) + " ranks cannot be split into groups of ranks_per_variant = " +
                         std::to_string(rpv) + " (" + std::to_string(ranks % rpv) + " would be left over)",
                     "make --nodes x --ntasks-per-node a multiple of " + std::to_string(rpv) +
                         ", or change [train] ranks_per_variant");
  if (s.gpus_per_node > 0 && s.gpus_per_node != s.ntasks_per_node)
    log::warn("--gpus-per-node " + std::to_string(s.gpus_per_node) + " differs from --ntasks-per-node " +
              std::to_string(s.ntasks_per_node) + ": fastudy uses one GPU per rank (by local rank)");

  std::error_code ec;
  const std::string grid = fs::absolute(st.file, ec).lexically_normal().string();
  ctx.out_dir = fs::absolute(ctx.out_dir, ec).lexically_normal().string();
  if (!ctx.out_dir.empty() && ctx.out_dir.back() == '/') ctx.out_dir.pop_back();
  const std::string& out = ctx.out_dir;
  // #SBATCH lines take no quoting (sbatch strips quotes and backslashes), and sbatch expands % in --output.
  const bool control = std::any_of(out.begin(), out.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  if (control || out.find_first_of(" %'\"\\") != std::string::npos)
    throw UsageError("the output directory " + shell_quote(out) + " contains a blank, a control character (a newline), a "
                     "quote, a backslash or '%', which an #SBATCH --output line cannot hold",
                     "choose an output directory without blanks, control characters, quotes, backslashes or '%' (--out DIR)");
  const std::string text = sbatch_script(ctx, grid, out, limit);

  // The output directory gets study.toml like any phase's: the job's `--resume` and a later
  // `fastudy GRID.toml --out OUT --resume` then both see a study (the script and Slurm's log in an
  // otherwise unmarked directory would make it "not a fastudy study").
  prepare_output(ctx);
  const std::string script = (fs::path(out) / "fastudy.sbatch").string();
  atomic_write(script, text);
  ::chmod(script.c_str(), 0755);
  log::info("wrote " + script + " (" + std::to_string(st.variants.size()) + " variants, " + std::to_string(ranks) +
            " ranks, time limit " + s.time + ", warning " + std::to_string(warning_lead_seconds(limit)) + " s before)");

  if (!s.submit) {
    log::info("submit it with: sbatch " + shell_quote(script));
    return kExitOk;
  }
  const std::string id = submit_script(script);
  // With -q only the job id is printed, for scripts: `id=$(fastudy slurm ... --submit -q)`.
  if (log::level() == log::Level::quiet) std::cout << id << "\n";
  log::info("submitted job " + id + "; log: " + out + "/slurm-" + id + ".out; progress: fastudy status " + shell_quote(out));
  return kExitOk;
}

}  // namespace fastudy
