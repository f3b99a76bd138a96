// fastudy: measure and rank the sources of numeric deviation in neural-network training.
//
//   fastudy GRID.toml                 run every phase the grid enables (same as `fastudy run GRID.toml`)
//   mpirun -n 64 fastudy GRID.toml    the same over 64 ranks
//   fastudy <job> --help              the options of one job (plan, microbench, train, reduce, report, status, slurm)
//   fastudy readings [--json]         the readings (attention precision policies): what each models, its source
//
// Every job runs under `mpirun -n N` (or srun) as one job: run, microbench, train and reduce spread
// their work over the ranks; the others (plan, status, report, advise, replay, bisect, slurm) run on
// rank 0 while the other ranks wait for its exit code, so one lock is taken and the output is printed
// once. Started by hand (no launcher) those need no MPI at all.
//
// Exit codes: 0 success; 1 runtime failure (or some variants failed); 2 usage or configuration error
// (nothing written). On an MPI run a runtime failure on any rank ends the whole job (MPI_Abort).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "base/hugepages.hpp"
#include "base/log.hpp"
#include "fastudy/version.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "jobs/preflight.hpp"
#include "jobs/reduce_import.hpp"
#include "jobs/study_lock.hpp"
#include "kernels/attention.hpp"
#include "kernels/microbench.hpp"
#include "src/io/h5.hpp"
#include "src/io/hdf5_reader.hpp"
#include "src/runtime/mpi.hpp"

namespace po = boost::program_options;
using namespace fastudy;

namespace {

// `lead` followed by the words of `text`, in lines of at most `width` characters, every line after the
// first indented to the width of `lead`.
std::string wrapped(const std::string& lead, const std::string& text, std::size_t width) {
  std::string out, line = lead;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    if (line.size() > lead.size() && line.size() + 1 + w.size() > width) {
      out += line + "\n";
      line = std::string(lead.size(), ' ');
    } else if (line.size() > lead.size()) {
      line += ' ';
    }
    line += w;
  }
  return out + line;
}

constexpr const char* kReadingsSummary =
    "list the readings (attention precision policies): what each models, its source, where it runs";

void print_global_help(std::ostream& os) {
  os << "fastudy " FASTUDY_VERSION " - rank the sources of numeric deviation in neural-network training\n\n"
        "usage: fastudy [JOB] GRID.toml [options]      (JOB defaults to `run`)\n"
        "       mpirun -n N fastudy GRID.toml [options]\n\njobs:\n";
  for (const auto& j : job_registry()) {
    os << "  " << j.name << std::string(12 - std::min<std::size_t>(11, j.name.size()), ' ') << j.summary << "\n";
  }
  os << "  readings    " << kReadingsSummary << " (no grid: `fastudy readings [--json]`)\n";
  os << "\nprecision policies (readings: which implementation of attention in a format each models;\n"
        "`fastudy readings` adds the source each cites and where it runs):\n";
  for (const Reading& r : kReadings)
    os << "  " << r.name << std::string(15 - std::min<std::size_t>(14, r.name.size()), ' ') << r.models << "\n";
  os << "\nreal code beside the readings ([microbench] framework = [...]): each row is compared element by\n"
        "element with the reading that claims to model it, on the same inputs (microbench.csv: vs_reading,\n"
        "bit_identical, max_ulp_vs; `fastudy report` shows the measured agreement on the machine that ran it):\n";
  for (const auto& code : kRealCode) {
    const std::string claim = code.reading.empty() ? std::string("no reading")
                                                   : std::string(code.reading) + " " + std::string(to_string(code.kind));
    const std::string name = std::string(code.algorithm);
    os << wrapped("  " + name + std::string(23 - std::min<std::size_t>(22, name.size()), ' '),
                  "(" + std::string(code.device) + ", models " + claim + ") " + std::string(code.code), 110)
       << "\n";
  }
  os << "\nprecision policy steps (a custom [attention.policies.NAME] starts from `preset` (default pure),\n"
        "sets some of them: step = \"format\", and may set rounding = \"nearest\" | \"zero\" | \"stochastic\",\n"
        "scale = \"fused\" | \"after\" | \"before\" (the baseline's), quantization = \"none\" | \"head\" | \"block\",\n"
        "incoherent_processing and max_offset = beta (> 1: Qiu & Yao's fix for repeated row maxima); its\n"
        "tables [attention.policies.NAME.flash] and [...NAME.baseline] set steps of one attention kind only):\n";
  for (const auto& step : kPolicySteps)
    os << "  " << step.name << std::string(15 - std::min<std::size_t>(14, step.name.size()), ' ') << step.what << "\n";
  os << "\ncommon options: --out DIR, --resume, --force, -q/--quiet, -v/--verbose, -h/--help, --version\n"
        "`fastudy JOB --help` shows the options of one job.\n\n"
        "exit codes: 0 success; 1 runtime failure (or some variants failed or diverged);\n"
        "            2 usage or configuration error (nothing written)\n";
}

// `fastudy readings [--json]`: the readings table (kernels/attention.hpp kReadings), as text for a reader
// or as JSON for programs (the report's renderer reads it: analysis/report/readings.py).
int print_readings(int argc, char** argv) {
  const bool json = argc == 3 && std::string(argv[2]) == "--json";
  if (argc == 3 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h")) {
    std::cout << "fastudy readings: " << kReadingsSummary
              << "\nusage: fastudy readings [--json]\n\noptions of `readings`:\n"
                 "  --json                print the table as JSON (name, models, source, cuda, gpu_kernel, report);\n"
                 "                        the report's renderer reads it\n";
    return kExitOk;
  }
  if (argc > 3 || (argc == 3 && !json)) {
    print_error(UsageError(
        "`fastudy readings` takes no argument but --json (got '" + std::string(argv[argc - 1]) + "')",
        "fastudy readings [--json]"));
    return kExitUsage;
  }
  if (json) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const Reading& r : kReadings)
      rows.push_back({{"name", r.name},
                      {"models", r.models},
                      {"source", r.source},
                      {"cuda", r.cuda},
                      {"gpu_kernel",
                       make_policy(r.name, Format::fp16, AttentionKind::flash).kernel != FlashKernel::framework},
                      {"report", r.report}});
    std::cout << nlohmann::ordered_json{{"readings", rows}}.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "readings (precision policies: which implementation of attention in a format each models; [attention]\n"
               "policy and a sweep's policies name them):\n";
  for (const Reading& r : kReadings) {
    const std::string lead = "  " + std::string(r.name) + std::string(8 - std::min<std::size_t>(7, r.name.size()), ' ');
    std::cout << wrapped(lead, std::string(r.models), 110) << "\n";
    const std::string indent(lead.size(), ' ');
    if (!r.source.empty()) std::cout << wrapped(indent + "source: ", std::string(r.source), 110) << "\n";
    std::cout << indent << "runs on: " << (r.cuda ? "the CPU and the CUDA kernels" : "the CPU kernels only") << "\n";
  }
  return kExitOk;
}

po::options_description common_options() {
  po::options_description d("common options");
  d.add_options()("help,h", "show this help")("out,o", po::value<std::string>(),
                                               "output directory (overrides [study] out)")(
      "resume", "continue the study in an existing output directory")(
      "force", "redo this job in an existing study: first delete the files it wrote there (`run`: every file "
               "fastudy wrote), as OUT/fastudy.manifest lists them, never other files; with --resume, accept a "
               "changed grid (its changed variants train again)")(
      "quiet,q", "print warnings and errors only (a failure always says why)")("verbose,v", "print debug lines");
  return d;
}

po::options_description job_options(const JobInfo& job, CliOptions& o) {
  po::options_description d("options of `" + job.name + "`");
  if (job.options) job.options(d, o);
  return d;
}

struct Parsed {
  CliOptions opts;
  const JobInfo* job = nullptr;
  bool help = false;
  bool verbose = false;
  bool quiet = false;
};

// Whether the first word of a command line without a job name was meant as one: a word that is no
// option, names no file, has no '.' or '/' (as grid paths do) and is followed by another positional
// word (`fastudy trian grid.toml`). `fastudy grid.toml` runs the grid.
bool looks_like_job_name(const std::vector<std::string>& args) {
  const std::string& first = args[0];
  if (first.empty() || first[0] == '-' || first.find_first_of("./") != std::string::npos) return false;
  std::error_code ec;
  if (std::filesystem::exists(first, ec)) return false;
  return std::any_of(args.begin() + 1, args.end(), [](const std::string& a) { return !a.empty() && a[0] != '-'; });
}

// Parse the command line; throws UsageError.
Parsed parse_command_line(int argc, char** argv) {
  Parsed p;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (int i = 0; i < argc; ++i) p.opts.command_line += (i ? " " : "") + shell_word(argv[i]);
  std::string name = "run";
  if (!args.empty() && find_job(args[0])) {
    name = args[0];
    args.erase(args.begin());
  } else if (!args.empty() && looks_like_job_name(args)) {
    std::string jobs;
    for (const auto& j : job_registry()) jobs += (jobs.empty() ? "" : ", ") + j.name;
    throw UsageError("unknown job '" + args[0] + "'", "the jobs are " + jobs + "; `fastudy --help` describes them");
  }
  p.job = find_job(name);
  p.opts.command = name;

  po::options_description all = common_options();
  po::options_description own = job_options(*p.job, p.opts);
  all.add(own);
  po::options_description hidden;
  hidden.add_options()("target", po::value<std::string>(&p.opts.target), "GRID.toml or OUT");
  po::options_description cmdline;
  cmdline.add(all).add(hidden);
  po::positional_options_description pos;
  pos.add("target", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(cmdline).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()), "see `fastudy " + name + " --help`");
  }
  if (vm.count("help")) {
    p.help = true;
    std::cout << "fastudy " << name << ": " << p.job->summary << "\nusage: " << p.job->usage << "\n\n" << all;
    return p;
  }
  p.opts.resume = vm.count("resume") > 0;
  p.opts.force = vm.count("force") > 0;
  p.quiet = vm.count("quiet") > 0;
  p.verbose = vm.count("verbose") > 0;
  if (vm.count("out")) p.opts.out = vm["out"].as<std::string>();
  if (p.quiet && p.verbose) throw UsageError("-q and -v contradict each other", "pass one of them");
  stop_grace_seconds();  // a bad FASTUDY_STOP_GRACE_S is a usage error before anything runs
  if (p.opts.target.empty())
    throw UsageError("`fastudy " + name + "` needs " + (p.job->target_is_out ? "an output directory or a grid file" : "a grid file"),
                     "usage: " + p.job->usage);
  return p;
}

// Load the study from a grid file, or from OUT/study.toml when the target is an output directory.
JobContext make_context(const Parsed& p) {
  JobContext ctx;
  ctx.opts = p.opts;
  namespace fs = std::filesystem;
  std::error_code ec;
  // MPI-IO (and HDF5 through it) resolves relative paths against getcwd(), which fails for a working
  // directory longer than PATH_MAX; Open MPI then crashes. Refused before anything is locked or written.
  if (std::vector<char> cwd(PATH_MAX + 1); ::getcwd(cwd.data(), cwd.size()) == nullptr) {
    const int err = errno;
    throw UsageError(err == ENAMETOOLONG || err == ERANGE
                         ? "the working directory's path is longer than PATH_MAX (" + std::to_string(PATH_MAX) +
                               " bytes), which MPI-IO cannot work from"
                         : std::string("the working directory cannot be told (getcwd: ") + std::strerror(err) + ")",
                     "run fastudy from a folder with a shorter path (the grid and --out may be anywhere)");
  }
  if (p.job->target_is_out && !fs::exists(p.opts.target, ec))
    throw UsageError(p.opts.target + " does not exist: `fastudy " + p.opts.command +
                         "` takes a study's output directory or its grid file",
                     "check the path: pass the directory the study was written to (its --out) or its grid file");
  if (fs::is_directory(p.opts.target, ec)) {
    if (!p.job->target_is_out)
      throw UsageError(p.opts.target + " is a directory; `fastudy " + p.opts.command + "` takes a grid file",
                       "usage: " + p.job->usage);
    const std::string marker = (fs::path(p.opts.target) / "study.toml").string();
    if (!fs::exists(marker, ec))
      throw UsageError(p.opts.target + " holds no fastudy study (no study.toml)", "pass the study's output directory");
    ctx.study = parse_study(read_sealed(marker, kStudyTomlHint), marker);
    ctx.out_dir = p.opts.target;
  } else {
    ctx.study = load_study(p.opts.target);
    ctx.out_dir = p.opts.out.empty() ? ctx.study->out : p.opts.out;
    keep_study_record(ctx);
  }
  // An output path that cannot be resolved (a symbolic link loop, a file where a folder is expected)
  // is a usage error, named before anything is locked or written.
  if (const fs::file_status out_status = fs::status(ctx.out_dir, ec);
      ec && ec != std::errc::no_such_file_or_directory && out_status.type() != fs::file_type::directory)
    throw UsageError("'" + ctx.out_dir + "' cannot be the study's output directory: " + ec.message(),
                     "pass another --out (or [study] out)");
  if (ctx.study->imported() && (p.opts.command == "train" || p.opts.command == "microbench"))
    throw UsageError("`fastudy " + p.opts.command + "` runs fastudy's own model, and " + ctx.study->file +
                         " imports its runs ([import])",
                     "an imported study runs reduce and report: fastudy run GRID.toml (or fastudy reduce GRID.toml)");
  if (!p.opts.train.device.empty()) {
    // --device: where the variants run, not what they compute (no hash changes).
    const std::optional<Device> device = parse_device(p.opts.train.device);
    if (!device) throw UsageError("--device " + p.opts.train.device + " is not a device", "use auto, cpu or cuda");
    ctx.study->train.device = *device;
    for (Variant& v : ctx.study->variants) v.train.device = *device;
  }
  ctx.prov = make_provenance(p.opts.command_line, ctx.study->file, ctx.study->hash);
  return ctx;
}

// What the preflight checks for a job: the train phase (run with it, train) and the report phase
// (run with it); nullopt for jobs it has nothing to check for.
std::optional<PreflightScope> preflight_scope(const JobContext& ctx, int ranks, int ranks_on_host) {
  PreflightScope s;
  const Study& st = *ctx.study;
  s.train = ctx.opts.command == "train" || (ctx.opts.command == "run" && st.has_phase("train"));
  s.report = ctx.opts.command == "run" && st.has_phase("report");
  if (!s.train && !s.report) return std::nullopt;
  s.ranks = ranks;
  s.ranks_on_host = ranks_on_host;
  s.out = ctx.out_dir;
  return s;
}

// The end of an MPI job: after a failed HDF5 close (a full disk), MPI_Finalize would crash inside
// HDF5 (it closes the broken file or object again), so the process ends here, with its exit code, instead.
int finish_mpi(int code, StudyLock& lock) {
  lock.release();
  if (h5::failed_closes() > 0) {
    log::warn("an HDF5 file could not be closed after an I/O error; ending without MPI_Finalize");
    std::cout.flush();
    std::cerr.flush();
    std::_Exit(code == kExitOk ? kExitFailure : code);
  }
  return code;
}

// Quiet never hides why a job failed: every path to a non-zero exit prints an error or a warning
// line, and a job that returns one without (a path that forgot) still gets a line, from the process
// that owns the console.
int said_why(const std::string& job, int code) {
  if (code != kExitOk && log::owns_console() && log::problems_printed() == 0)
    log::error("`fastudy " + job + "` ended with exit code " + std::to_string(code) +
               " without naming a reason; run it again without -q (and with -v) to see its progress");
  return code;
}

int exit_code_of(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const UsageError*>(&e)) return kExitUsage;
  return kExitFailure;
}

// The study of the command line, loaded before MPI starts (a peek: a grid that does not load is left to
// the job, which reports it).
std::optional<Study> peek_study(const Parsed& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  try {
    return load_study(fs::is_directory(p.opts.target, ec) ? (fs::path(p.opts.target) / "study.toml").string() : p.opts.target);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Whether the job may read HDF5 files other programs wrote ([import] path, a microbenchmark's input
// file): libhdf5 then parses them in a reader process (src/io/hdf5_reader.hpp), which must start here,
// before MPI starts and while the program is one thread.
bool reads_hdf5_of_others(const std::optional<Study>& st) {
  if (!st) return false;
  auto hdf5 = [](const std::string& path) {
    for (const char* ext : {".h5", ".hdf5"})
      if (path.size() > std::strlen(ext) && path.compare(path.size() - std::strlen(ext), std::strlen(ext), ext) == 0) return true;
    return false;
  };
  if (st->imported() && hdf5(st->import.path)) return true;
  for (const auto& sw : st->microbench.sweeps)
    if (hdf5(sw.input_file)) return true;
  return false;
}

#ifdef FASTUDY_LITE
// Whether the job's study imports torch.save files, which only fastudy-main reads (through LibTorch):
// then fastudy-lite hands the command line over, before MPI starts. A grid that does not load is left
// to the job, which reports it.
bool imports_torch_files(const std::optional<Study>& st) { return st && imports_torch_files(*st); }
#endif

}  // namespace

// Huge pages for the heap: may re-execute the process once, before LibTorch's initialisers run
// (base/hugepages.hpp).
FASTUDY_HUGEPAGES_AT_PREINIT();

#ifdef FASTUDY_LITE
extern char** environ;
#endif

namespace {

// `fastudy`, `fastudy --help`, `fastudy --version` and `fastudy readings`: answered before anything
// else (no MPI, no study); nullopt for any other command line.
std::optional<int> help_or_version(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_global_help(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  if (std::string(argv[1]) == "readings") return print_readings(argc, argv);
  if (std::string(argv[1]) == "--version") {
    std::cout << "fastudy " FASTUDY_VERSION " (git " FASTUDY_GIT_SHA ")\n";
    return kExitOk;
  }
  return std::nullopt;
}

// A job that does not use MPI, started without a launcher: one process, no MPI at all.
int run_one_process(const Parsed& parsed) {
  install_stop_signals();
  try {
    JobContext ctx = make_context(parsed);
    if (auto scope = preflight_scope(ctx, 1, 1)) preflight(*ctx.study, *scope);
    StudyLock lock;
    if (parsed.job->writes_study) {
      lock = StudyLock::acquire(ctx.out_dir, ctx.opts.command_line);
      open_study(ctx);
    }
    return said_why(parsed.opts.command, parsed.job->run(ctx));
  } catch (const SilentExit& e) {
    return e.code();
  } catch (const std::exception& e) {
    return print_error(e);
  }
}

// Every rank loads and validates the grid into `ctx`; if any rank fails, all return the worst exit
// code (2 for a bad grid), the first rank that failed printing why, so a bad grid never leaves ranks
// hanging and nothing is written. kExitOk when every rank loaded it.
int load_on_every_rank(mpi::Comm& world, const Parsed& parsed, std::optional<JobContext>& ctx) {
  std::string load_error, load_hint;
  int load_code = kExitOk;
  try {
    ctx = make_context(parsed);
  } catch (const std::exception& e) {
    load_error = e.what();
    if (const auto* fe = dynamic_cast<const Error*>(&e)) load_hint = fe->hint();
    load_code = exit_code_of(e);
  }
  const std::int64_t worst = world.allreduce_max(static_cast<std::int64_t>(load_code));
  if (worst != kExitOk) {
    const std::int64_t first_bad = world.allreduce_max(load_code != kExitOk ? static_cast<std::int64_t>(world.size() - world.rank()) : 0);
    const int reporter = world.size() - static_cast<int>(first_bad);
    if (world.rank() == reporter) {
      log::error((world.size() > 1 ? "[rank " + std::to_string(world.rank()) + "] " : std::string()) + load_error);
      if (!load_hint.empty()) std::cerr << "hint: " << load_hint << "\n";
    }
  }
  return static_cast<int>(worst);
}

// The job's ranks and hosts into its provenance; returns every rank's host name, in rank order.
std::vector<std::string> record_ranks(mpi::Comm& world, JobContext& ctx) {
  ctx.world = &world;
  ctx.prov.ranks = world.size();
  std::vector<std::string> hosts = world.allgather(mpi::processor_name());
  ctx.prov.hosts.clear();
  for (const auto& h : hosts)
    if (std::find(ctx.prov.hosts.begin(), ctx.prov.hosts.end(), h) == ctx.prov.hosts.end()) ctx.prov.hosts.push_back(h);
  return hosts;
}

// Before anything is written: the preflight (every problem at once), then one writer per study: rank 0
// checks and takes the lock into `lock`, or every rank leaves with the exit code returned, rank 0
// printing why. nullopt: go on.
std::optional<int> preflight_and_lock(mpi::Comm& world, const Parsed& parsed, JobContext& ctx,
                                      const std::vector<std::string>& hosts, StudyLock& lock) {
  const int on_host = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[0]));
  try {
    if (auto scope = preflight_scope(ctx, world.size(), on_host))
      on_root(world, [&] { preflight(*ctx.study, *scope); });
    if (parsed.job->writes_study) {
      on_root(world, [&] {
        lock = StudyLock::acquire(ctx.out_dir, ctx.opts.command_line);
        open_study(ctx);
      });
    }
  } catch (const SilentExit& e) {
    return e.code();
  }
  return std::nullopt;
}

// A one-process job under a launcher: rank 0 runs it as `fastudy JOB` alone would (its output, no
// provenance header), the other ranks wait for its exit code, which every rank returns.
int run_on_rank_zero(mpi::Comm& world, const Parsed& parsed, const JobContext& ctx, const std::string& host) {
  std::int64_t code = kExitOk;
  try {
    on_root(world, [&] {
      JobContext one = ctx;
      one.world = nullptr;
      one.prov.ranks = 1;  // its outputs' provenance: the one process that ran it
      one.prov.hosts = {host};
      code = said_why(parsed.opts.command, parsed.job->run(one));
    });
  } catch (const SilentExit& e) {
    code = e.code();
  }
  world.bcast(code);
  return static_cast<int>(code);
}

// An MPI job on every rank: the provenance header, the job, its exit code; a failure on any rank of a
// job of several ends the whole job (MPI_Abort) with its message.
int run_mpi_job(mpi::Comm& world, const Parsed& parsed, JobContext& ctx, StudyLock& lock) {
  log::info(ctx.prov.header());
  try {
    return finish_mpi(said_why(parsed.opts.command, parsed.job->run(ctx)), lock);
  } catch (const SilentExit& e) {
    return finish_mpi(e.code(), lock);
  } catch (const std::exception& e) {
    const int code = exit_code_of(e);
    if (world.size() == 1) return finish_mpi(print_error(e), lock);
    const auto* fe = dynamic_cast<const Error*>(&e);
    std::string msg = std::string(e.what()) + (fe && !fe->hint().empty() ? "\nhint: " + fe->hint() : std::string());
    lock.release();
    mpi::abort(code, msg);
  }
}

// A job under MPI (every job that uses it, and the others when a launcher started several
// processes): MPI joins the processes, the grid is loaded on every rank, rank 0 checks and locks, then
// the job runs on every rank, or on rank 0 alone for a job that does not use MPI (one lock, one output),
// and every rank leaves with its exit code.
int run_under_mpi(int& argc, char**& argv, const Parsed& parsed) {
  std::optional<mpi::MpiSession> session;
  try {
    session.emplace(&argc, &argv);
  } catch (const std::exception& e) {
    print_error(e);
    return kExitFailure;
  }
  mpi::Comm world = mpi::Comm::world();
  log::set_console(world.rank() == 0);
  install_stop_signals();

  std::optional<JobContext> ctx;
  if (const int code = load_on_every_rank(world, parsed, ctx); code != kExitOk) return code;
  const std::vector<std::string> hosts = record_ranks(world, *ctx);
  StudyLock lock;
  if (const std::optional<int> code = preflight_and_lock(world, parsed, *ctx, hosts, lock)) return *code;
  if (!parsed.job->uses_mpi) return finish_mpi(run_on_rank_zero(world, parsed, *ctx, hosts[0]), lock);
  return run_mpi_job(world, parsed, *ctx, lock);
}

}  // namespace

int main(int argc, char** argv) {
#ifdef FASTUDY_LITE
  // fastudy-lite (no trainer, no LibTorch): a command line that is not one of its jobs (registry_lite.cpp)
  // nor --version or `readings` goes to fastudy-main beside it, unchanged.
  if (argc < 2 ||
      (std::string(argv[1]) != "--version" && std::string(argv[1]) != "readings" && find_job(argv[1]) == nullptr)) {
    return exec_beside_or_fail("fastudy-main", argv, environ);
  }
#endif
  register_program_readers();
  if (const std::optional<int> code = help_or_version(argc, argv)) return *code;

  Parsed parsed;
  try {
    parsed = parse_command_line(argc, argv);
  } catch (const std::exception& e) {
    print_error(e);
    return kExitUsage;
  }
  if (parsed.help) return kExitOk;
  const std::optional<Study> peeked = peek_study(parsed);
#ifdef FASTUDY_LITE
  if (imports_torch_files(peeked)) return exec_beside_or_fail("fastudy-main", argv, environ);
#endif
  if (reads_hdf5_of_others(peeked)) {
    try {
      io::start_hdf5_reader();
    } catch (const std::exception& e) {
      return print_error(e);
    }
  }
  log::set_level(parsed.quiet ? log::Level::quiet : parsed.verbose ? log::Level::debug : log::Level::info);

  // A job that does not use MPI runs as one process. Started by a launcher with several processes
  // (`mpirun -n 4 fastudy report OUT`) it still runs once: MPI joins the processes, rank 0 runs the
  // job (one lock, one output) and every rank leaves with its exit code.
  if (!parsed.job->uses_mpi && mpi::launched_ranks() <= 1) return run_one_process(parsed);
  return run_under_mpi(argc, argv, parsed);
}
