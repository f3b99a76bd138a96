// The jobs (phases and tools) of the fastudy command line, registered in one table (registry.cpp).
//
// A job gets a JobContext: the parsed command line, the study (loaded and validated before anything
// is written), the output directory and the provenance header. It returns an exit code (0 success,
// 1 runtime failure) or throws: ConfigError/UsageError -> 2, anything else -> 1, handled by main().
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/quote.hpp"  // shell_quote, shell_word: the words of the commands jobs print and write
#include "src/core/config.hpp"
#include "src/core/provenance.hpp"

namespace boost::program_options {
class options_description;
}

namespace fastudy {

namespace mpi {
class Comm;
}

struct SlurmOptions {
  int nodes = 1;
  int ntasks_per_node = 1;
  int gpus_per_node = 0;
  int cpus_per_task = 0;  // 0: Slurm's default (one CPU per task)
  std::string time = "01:00:00";
  std::string partition;
  std::string account;
  std::string launcher = "srun";  // srun | mpirun
  bool submit = false;
};

// A step option not given on the command line (any number a user passes, negative ones too, is told
// apart from it).
inline constexpr std::int64_t kNoStep = std::numeric_limits<std::int64_t>::min();

// Each job's own command-line options, set by the job's options function (declared below, defined in
// the job's file next to the code that reads them) and read only by that job (`run` takes train's and
// reduce's, as it runs their phases).
struct PlanOptions {
  int ranks = 0;             // --ranks (0: not given: the ranks it runs on, 1 or mpirun's N)
  int gpus_per_node = -1;    // --gpus-per-node (-1: not given: this machine's)
  int ranks_per_node = 0;    // --ranks-per-node (0: every rank on one node)
  int measure_steps = 3;     // --measure-steps
};
struct TrainOptions {
  std::vector<std::string> variants;  // --variant (empty: all)
  std::string device;        // --device (overrides [train] device; "" keeps it)
  bool profile = false;      // --profile: print where each variant's steps spend their time
  bool cuda_graph = false;   // --cuda-graph: replay the steps' forward and backward from a CUDA graph
};
struct ReduceOptions {
  bool allow_missing = false;  // --allow-missing
};
struct ReplayOptions {
  std::vector<std::string> variants;  // --variant (one)
  std::int64_t from_step = kNoStep;   // --from
  std::int64_t steps = 0;             // --steps (0: to the original's last step)
  std::vector<std::string> sets;      // --set AXIS=VALUE
};
struct BisectOptions {
  std::vector<std::string> variants;  // --variant (one: A)
  std::string against;                // --against
  std::int64_t at_step = kNoStep;     // --step
};
struct AdviseOptions {
  double target_ulps = 0;  // --target-ulps (0: the baseline's error)
};

struct CliOptions {
  std::string command;       // the job name ("run", "plan", ...)
  std::string target;        // GRID.toml, or OUT for report/status
  std::string out;           // --out (overrides [study] out)
  bool resume = false;
  bool force = false;
  std::string command_line;  // argv as shell words (shell_word) on one line, for provenance
  // The jobs' own options (only the running job's are set).
  PlanOptions plan;
  TrainOptions train;
  ReduceOptions reduce;
  ReplayOptions replay;
  BisectOptions bisect;
  AdviseOptions advise;
  SlurmOptions slurm;
};

struct JobContext {
  CliOptions opts;
  std::optional<Study> study;  // set when the target is (or the output directory holds) a grid
  std::string out_dir;         // resolved output directory
  Provenance prov;
  mpi::Comm* world = nullptr;  // set for jobs that run under MPI
};

using JobFn = int (*)(JobContext&);
// Adds a job's own command-line options to `d`, bound to the fields of CliOptions they set. Each job
// declares its options in its own file, next to the code that reads them.
using JobOptionsFn = void (*)(boost::program_options::options_description& d, CliOptions& o);

struct JobInfo {
  std::string name;
  std::string summary;
  std::string usage;     // "fastudy plan GRID.toml --ranks N"
  bool uses_mpi = false; // initialise MPI and gather ranks/hosts for provenance
  bool target_is_out = false;  // the positional argument is an output directory (or a grid)
  JobFn run = nullptr;
  JobOptionsFn options = nullptr;  // null: the job has only the common options
  bool writes_study = false;  // holds the study lock (OUT/fastudy.lock, study_lock.hpp) while it runs
};

// The values of JobInfo's boolean columns by name, so that a row of the tables (registry.cpp,
// registry_common.cpp) says what each one means.
inline constexpr bool kUsesMpi = true, kOneProcess = false;  // uses_mpi
inline constexpr bool kTakesOut = true, kTakesGrid = false;  // target_is_out
inline constexpr bool kLocksStudy = true, kNoLock = false;   // writes_study

// The program's table (registry.cpp in fastudy-main, registry_lite.cpp in fastudy-lite) and lookup.
const std::vector<JobInfo>& job_registry();
// Registers the tensor-file readers that need this program's libraries (fastudy-main: torch.save
// through LibTorch, src/train/torch_file.hpp; fastudy-lite: none). main() calls it first.
void register_program_readers();
const JobInfo* find_job(const std::string& name);
// reduce, report, status and slurm: the jobs without the trainer (registry_common.cpp).
std::vector<JobInfo> trainer_free_jobs();

// The jobs, one file each.
int job_run(JobContext& ctx);
int job_plan(JobContext& ctx);
int job_microbench(JobContext& ctx);
int job_train(JobContext& ctx);
int job_reduce(JobContext& ctx);
int job_report(JobContext& ctx);
int job_status(JobContext& ctx);
int job_slurm(JobContext& ctx);
int job_replay(JobContext& ctx);
int job_bisect(JobContext& ctx);
int job_advise(JobContext& ctx);
// Their own options (jobs without any have none here).
void run_options(boost::program_options::options_description& d, CliOptions& o);
void plan_options(boost::program_options::options_description& d, CliOptions& o);
void train_options(boost::program_options::options_description& d, CliOptions& o);
void reduce_options(boost::program_options::options_description& d, CliOptions& o);
void slurm_options(boost::program_options::options_description& d, CliOptions& o);
void replay_options(boost::program_options::options_description& d, CliOptions& o);
void bisect_options(boost::program_options::options_description& d, CliOptions& o);
void advise_options(boost::program_options::options_description& d, CliOptions& o);

// Whether the report renderer's interpreter imports the modules it needs: nullopt, or the problem
// with an install hint (report.cpp; the preflight of a grid with the report phase).
std::optional<std::string> report_modules_problem();

// Output directory policy shared by the phases that create results (output.cpp).
// A new or empty directory is created and receives its manifest (OUT/fastudy.manifest, base/manifest.hpp),
// study.toml (the resolved config), variants.csv and provenance.txt. An existing study directory is
// refused unless --resume (continue) or --force (open_study has deleted what the job wrote before; the
// study is written again); open_study has compared the configurations. A non-empty directory that is
// not a fastudy study is always refused.
void prepare_output(JobContext& ctx);
// Before every job that writes a study (main(), on rank 0, with the lock held): in an existing study,
// a grid of another configuration than study.toml's is refused (UsageError naming the settings that
// differ) unless `run --force` (the study starts over) or `train`/`run --resume --force` (the changed
// variants train again); then --force (without --resume) deletes the files the job wrote before, as the manifest lists them (for
// `run`: every file fastudy wrote there), never anything else and never OUT itself; a study without a
// manifest, or with one that does not match its checksum, is refused (UsageError, nothing deleted).
// Otherwise the job's fixed output names are added to the manifest of a study fastudy wrote.
void open_study(JobContext& ctx);
// When OUT already holds a study of the grid's configuration whose [study] out only differs (a study
// moved, or a grid that names another place and is run with --out OUT), the study keeps its record: the
// loaded study takes study.toml's out, resolved text and hash, so that study.toml is not rewritten and
// every result keeps a hash equal to study.toml's. make_context calls it on every rank.
void keep_study_record(JobContext& ctx);
// A text file of the study read whole: only a regular file (a FIFO in its place is not waited for) of
// at most 1 GiB; an Error naming the file otherwise.
std::string read_text_file(const std::string& path);
// The hint of a study.toml that does not match its checksum (OUT/study.toml.crc).
extern const char* const kStudyTomlHint;
bool file_exists(const std::string& path);

}  // namespace fastudy
