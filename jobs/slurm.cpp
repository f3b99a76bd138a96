// `fastudy slurm GRID.toml --nodes N --ntasks-per-node T --time HH:MM:SS [--submit]`: write an sbatch
// script for the study into its output directory (OUT/fastudy.sbatch) and, with --submit, hand it to
// sbatch.
//
// The script survives time limits: Slurm sends the batch shell SIGUSR1 some minutes before the limit
// (--signal=B:USR1@lead), the shell forwards it to fastudy, which checkpoints at the next step and exits
// with code 1; the shell then requeues the job (scontrol requeue, --requeue), and the next run continues
// the study with --resume. The body of the script is the same for every study: the text after the
// settings block is slurm/fastudy.sbatch.in's body (a test keeps the two identical).
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

#include <boost/program_options.hpp>

#include "base/error.hpp"
#include "base/log.hpp"
#include "jobs/estimate.hpp"
#include "jobs/job.hpp"

namespace fs = std::filesystem;

namespace po = boost::program_options;

namespace fastudy {

namespace {

// The part of the script after the settings block; identical to the body of slurm/fastudy.sbatch.in.
const char* const kSbatchBody = R"BODY(# ---- body (the same in every generated script; see slurm/fastudy.sbatch.in) ----
#
# Knobs clusters usually need (uncomment and adapt here, or set them in the submitting shell:
# sbatch exports its environment to the job):
#   module load openmpi hdf5 cuda            # the modules fastudy was built with
#   export FASTUDY_TORCH_THREADS=${SLURM_CPUS_PER_TASK:-1}   # LibTorch threads per rank
#   export NCCL_DEBUG=WARN                   # INFO to see the rings/trees NCCL builds
#   export NCCL_SOCKET_IFNAME=ib0            # the interface NCCL's bootstrap uses (or ^lo,docker)
#   export NCCL_IB_HCA=mlx5                  # restrict NCCL to these InfiniBand adapters
# One rank per GPU: ask for --ntasks-per-node equal to --gpus-per-node; fastudy takes the GPU of
# its local rank (CPU when there is none). With srun, `--gpu-bind=closest` (or `single:1`) pins
# each task to its GPU's NUMA domain. srun's MPI plugin: pmix needs an Open MPI built with PMIx and
# a Slurm with mpi/pmix (`srun --mpi=list`); otherwise set FASTUDY_SRUN_MPI=pmi2, or use mpirun.

set -u

requeue=
child=

# Slurm's warning signal (SIGUSR1, asked for with --signal=B:USR1@...) reaches this shell: tell
# fastudy to checkpoint and stop, and requeue the job afterwards. A SIGTERM (scancel, or the time
# limit itself) is forwarded the same way but does not requeue: the job is ending for good.
# srun forwards signals to every task. mpirun forwards SIGUSR1 to every rank but answers SIGTERM by
# killing them, so mpirun always gets SIGUSR1 (fastudy treats both the same).
forward_stop() {
  [ "$1" = USR1 ] && requeue=yes
  echo "fastudy.sbatch: SIG$1 received: asking fastudy to checkpoint and stop"
  [ -z "$child" ] && return
  case $LAUNCHER in
    srun) kill -s "$1" "$child" 2>/dev/null ;;
    *) kill -s USR1 "$child" 2>/dev/null ;;
  esac
}
trap 'forward_stop USR1' USR1
trap 'forward_stop TERM' TERM

echo "fastudy.sbatch: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}, $(date -u '+%F %T') UTC"

# --resume always: the first run creates OUT's outputs, a requeued one continues them.
case $LAUNCHER in
  srun) srun --mpi="${FASTUDY_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 \
          "$FASTUDY" run "$GRID" --out "$OUT" --resume & ;;
  mpirun) mpirun -n "${SLURM_NTASKS:-1}" "$FASTUDY" run "$GRID" --out "$OUT" --resume & ;;
  *) echo "fastudy.sbatch: unknown LAUNCHER=$LAUNCHER (srun or mpirun)" >&2; exit 2 ;;
esac
child=$!
[ -n "$requeue" ] && forward_stop USR1

# A trapped signal interrupts `wait`: wait again until the launcher has really ended.
while :; do
  wait "$child"
  kill -0 "$child" 2>/dev/null || break
done
wait "$child"
code=$?
# Nothing left to forward (and `scontrol requeue` itself sends this shell a SIGTERM).
trap '' USR1 TERM

if [ -n "$requeue" ] && [ "$code" -ne 0 ]; then
  echo "fastudy.sbatch: fastudy stopped on the warning signal (exit $code); requeueing job $SLURM_JOB_ID to resume"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
  echo "fastudy.sbatch: scontrol requeue failed; resubmit this script to continue (it resumes)" >&2
fi
echo "fastudy.sbatch: fastudy exited with code $code, $(date -u '+%F %T') UTC"
exit "$code"
)BODY";

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

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string job_name_of(const std::string& study) {
  std::string n = "fastudy-";
  for (char c : study) n += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  return n;
}

// The path of the running executable, so that the job runs the same fastudy that wrote the script.
std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("fastudy") : p.string();
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

  std::ostringstream os;
  os << "#!/bin/bash\n";
  os << "# fastudy sbatch script for study '" << st.name << "', written by fastudy slurm (fastudy "
     << ctx.prov.version << ").\n";
  os << "#   grid:        " << grid << " (config hash " << st.hash << ")\n";
  os << "#   output:      " << out << "\n";
  os << "#   phases:      ";
  for (std::size_t i = 0; i < st.phases.size(); ++i) os << (i ? ", " : "") << st.phases[i];
  os << "\n#   variants:    " << st.variants.size() << " (";
  for (std::size_t i = 0; i < st.axes.size(); ++i)
    os << (i ? " x " : "") << st.axes[i].first << "[" << st.axes[i].second.size() << "]";
  os << ")\n";
  os << "#   ranks:       " << ranks << " = " << s.nodes << " node(s) x " << s.ntasks_per_node << " task(s)";
  if (s.gpus_per_node > 0) os << ", " << s.gpus_per_node << " GPU(s) per node";
  os << "\n#   groups:      " << ranks / rpv << " of " << rpv << " rank(s) (ranks_per_variant), variants scheduled dynamically\n";
  os << "#   checkpoints: about " << human_bytes(ckpt_total) << " in total (" << human_bytes(first.checkpoint_bytes)
     << " each, " << first.checkpoints << " per variant)\n";
  os << "#   memory:      about " << human_bytes(first.memory_per_rank) << " per rank while training\n";
  os << "#   time limit:  " << s.time << "; SIGUSR1 " << lead << " s before it: fastudy checkpoints, the job\n"
     << "#                requeues itself and the next run resumes (--resume)\n";
  os << "# Submit: sbatch " << out << "/fastudy.sbatch   Progress: fastudy status " << out << "\n";
  os << "# Regenerate: " << ctx.opts.command_line << "\n";
  os << "#SBATCH --job-name=" << job_name_of(st.name) << "\n";
  os << "#SBATCH --nodes=" << s.nodes << "\n";
  os << "#SBATCH --ntasks-per-node=" << s.ntasks_per_node << "\n";
  if (s.gpus_per_node > 0) os << "#SBATCH --gpus-per-node=" << s.gpus_per_node << "\n";
  os << "#SBATCH --time=" << s.time << "\n";
  if (!s.partition.empty()) os << "#SBATCH --partition=" << s.partition << "\n";
  if (!s.account.empty()) os << "#SBATCH --account=" << s.account << "\n";
  os << "#SBATCH --output=" << out << "/slurm-%j.out\n";
  os << "#SBATCH --open-mode=append\n";
  os << "#SBATCH --signal=B:USR1@" << lead << "\n";
  os << "#SBATCH --requeue\n";
  os << "\n# ---- settings (written by fastudy slurm; FASTUDY may be overridden from the environment) ----\n";
  os << "FASTUDY=${FASTUDY:-" << shell_quote(self_executable()) << "}\n";
  os << "GRID=" << shell_quote(grid) << "\n";
  os << "OUT=" << shell_quote(out) << "\n";
  os << "LAUNCHER=" << s.launcher << "\n\n";
  os << kSbatchBody;
  return os.str();
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
  // #SBATCH lines take no quoting, and sbatch expands % in --output.
  if (out.find_first_of(" \t\n%") != std::string::npos)
    throw UsageError("the output directory '" + out + "' contains a blank or '%', which an #SBATCH --output line cannot hold",
                     "choose an output directory without blanks or '%' (--out DIR)");
  const std::string text = sbatch_script(ctx, grid, out, limit);

  // The output directory gets study.toml like any phase's: the job's `--resume` and a later
  // `fastudy GRID.toml --out OUT --resume` then both see a study (the script and Slurm's log in an
  // otherwise unmarked directory would make it "not a fastudy study").
  prepare_output(ctx);
  const std::string script = (fs::path(out) / "fastudy.sbatch").string();
  write_text_file(script, text);
  ::chmod(script.c_str(), 0755);
  log::info("wrote " + script + " (" + std::to_string(st.variants.size()) + " variants, " + std::to_string(ranks) +
            " ranks, time limit " + s.time + ", warning " + std::to_string(warning_lead_seconds(limit)) + " s before)");

  if (!s.submit) {
    log::info("submit it with: sbatch " + script);
    return kExitOk;
  }
  const std::string id = submit_script(script);
  // With -q only the job id is printed, for scripts: `id=$(fastudy slurm ... --submit -q)`.
  if (log::level() == log::Level::quiet) std::cout << id << "\n";
  log::info("submitted job " + id + "; log: " + out + "/slurm-" + id + ".out; progress: fastudy status " + out);
  return kExitOk;
}

}  // namespace fastudy
