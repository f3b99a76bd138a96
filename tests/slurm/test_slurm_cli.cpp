// `fastudy slurm` without a Slurm: the generated sbatch script (its #SBATCH lines, header and body),
// validation errors (exit 2, nothing written), `bash -n` on the script, a missing sbatch, and the
// script's signal/requeue logic run by bash with stand-ins for mpirun and scontrol.
// The same script against a real Slurm: test_slurm_local.py (label "slurm").
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "tests/cli/cli_util.hpp"

extern char** environ;

using namespace fastudy::test;
namespace fs = std::filesystem;

namespace {

const std::string kSource = FASTUDY_SOURCE_DIR;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

// A grid of `variants` seeds with `steps` steps of a tiny model, train phase only.
std::string grid_text(const std::string& out, int ranks_per_variant, int steps = 4, int checkpoint_every = 2) {
  return "[study]\nname = \"slurm-cli\"\nout = \"" + out + "\"\nphases = [\"train\"]\n[grid]\nseed = [1, 2]\n"
         "[model]\nvocab = 16\nd_model = 16\nheads = 2\nlayers = 1\nseq_len = 16\nmlp_ratio = 2\n"
         "[data]\nkind = \"synthetic\"\nspan_len = 4\n[attention]\nblock_q = 8\nblock_kv = 8\n"
         "[train]\nsteps = " + std::to_string(steps) + "\nbatch = 4\nwarmup = 1\ncheckpoint_every = " +
         std::to_string(checkpoint_every) + "\nranks_per_variant = " + std::to_string(ranks_per_variant) + "\n";
}

// The text from the "# ---- body" marker to the end.
std::string body_of(const std::string& script) {
  const auto at = script.find("# ---- body");
  return at == std::string::npos ? std::string() : script.substr(at);
}

}  // namespace

TEST(SlurmCli, ScriptHasTheSbatchLinesAndHeader) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 2));
  RunResult r = run_fastudy("slurm " + grid + " --nodes 2 --ntasks-per-node 4 --gpus-per-node 4 --time 01:00:00 "
                            "--partition gpu --account proj_1 --launcher srun");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string s = read_file(fs::path(out) / "fastudy.sbatch");
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u);
  for (const char* line :
       {"#SBATCH --job-name=fastudy-slurm-cli", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4", "#SBATCH --time=01:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj_1",
        "#SBATCH --open-mode=append", "#SBATCH --requeue", "LAUNCHER=srun"})
    EXPECT_TRUE(has_line(s, line)) << line << "\n" << s;
  // 10% of one hour.
  EXPECT_TRUE(has_line(s, "#SBATCH --signal=B:USR1@360")) << s;
  EXPECT_TRUE(has_line(s, "#SBATCH --output=" + out + "/slurm-%j.out")) << s;
  EXPECT_TRUE(has_line(s, "OUT='" + out + "'")) << s;
  EXPECT_TRUE(has_line(s, "GRID='" + grid + "'")) << s;
  // The header: variants, ranks and groups, checkpoint volume.
  EXPECT_NE(s.find("#   variants:    2 (seed[2])"), std::string::npos) << s;
  EXPECT_NE(s.find("#   ranks:       8 = 2 node(s) x 4 task(s), 4 GPU(s) per node"), std::string::npos) << s;
  EXPECT_NE(s.find("#   groups:      4 of 2 rank(s)"), std::string::npos) << s;
  EXPECT_NE(s.find("#   checkpoints: about "), std::string::npos) << s;
  // Every #SBATCH line comes before the first command, or sbatch ignores it.
  EXPECT_LT(s.rfind("#SBATCH"), s.find("\nFASTUDY="));
  EXPECT_TRUE(fs::exists(fs::path(out) / "study.toml"));
  EXPECT_NE(fs::status(fs::path(out) / "fastudy.sbatch").permissions() & fs::perms::owner_exec, fs::perms::none);
  EXPECT_EQ(run_command("bash -n " + out + "/fastudy.sbatch").code, 0);
}

TEST(SlurmCli, OptionalLinesAndWarningLead) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 1));
  // time limit -> lead: 10% within [60 s, 600 s], at most half the limit.
  const std::pair<const char*, const char*> cases[] = {
      {"00:01:00", "30"}, {"00:05:00", "60"}, {"1-00:00:00", "600"}};
  for (const auto& [time, lead] : cases) {
    RunResult r = run_fastudy("slurm " + grid + " --ntasks-per-node 2 --time " + time + " --launcher mpirun --force");
    ASSERT_EQ(r.code, 0) << time << ": " << r.output;
    const std::string s = read_file(fs::path(out) / "fastudy.sbatch");
    EXPECT_TRUE(has_line(s, std::string("#SBATCH --signal=B:USR1@") + lead)) << time << "\n" << s;
    EXPECT_TRUE(has_line(s, std::string("#SBATCH --time=") + time)) << s;
    EXPECT_TRUE(has_line(s, "LAUNCHER=mpirun")) << s;
    EXPECT_EQ(s.find("#SBATCH --gpus-per-node"), std::string::npos) << s;
    EXPECT_EQ(s.find("#SBATCH --cpus-per-task"), std::string::npos) << s;
    EXPECT_EQ(s.find("#SBATCH --partition"), std::string::npos) << s;
    EXPECT_EQ(s.find("#SBATCH --account"), std::string::npos) << s;
  }
}

// --cpus-per-task C: the #SBATCH line, the header, and both launchers pass it on (srun's own
// --cpus-per-task, mpirun's C cores per rank), so each rank trains on C threads.
TEST(SlurmCli, CpusPerTaskReachesSbatchAndBothLaunchers) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 1));
  RunResult r = run_fastudy("slurm " + grid + " --ntasks-per-node 2 --cpus-per-task 4 --time 00:10:00 --force");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string s = read_file(fs::path(out) / "fastudy.sbatch");
  EXPECT_TRUE(has_line(s, "#SBATCH --cpus-per-task=4")) << s;
  EXPECT_NE(s.find("2 task(s), 4 CPU(s) each"), std::string::npos) << s;
  EXPECT_NE(s.find("${SLURM_CPUS_PER_TASK:+--cpus-per-task=\"$SLURM_CPUS_PER_TASK\"}"), std::string::npos) << s;
  EXPECT_NE(s.find("${SLURM_CPUS_PER_TASK:+--map-by slot:PE=\"$SLURM_CPUS_PER_TASK\"}"), std::string::npos) << s;
  r = run_fastudy("slurm " + grid + " --cpus-per-task -1 --time 00:10:00 --force");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cpus-per-task must be >= 0"), std::string::npos) << r.output;
}

TEST(SlurmCli, BodyIsTheTemplateInSlurmDirectory) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 1));
  ASSERT_EQ(run_fastudy("slurm " + grid + " --time 00:10:00").code, 0);
  const std::string generated = body_of(read_file(fs::path(out) / "fastudy.sbatch"));
  const std::string templ = body_of(read_file(fs::path(kSource) / "slurm" / "fastudy.sbatch.in"));
  ASSERT_FALSE(generated.empty());
  EXPECT_EQ(generated, templ) << "slurm/fastudy.sbatch.in and jobs/slurm.cpp's body differ";
  EXPECT_EQ(run_command("bash -n " + kSource + "/slurm/fastudy.sbatch.in").code, 0);
}

// The whole script is the template with its fields filled: the #! line, fastudy's header in place of
// the template's own comment, then the template from its first #SBATCH line with every @NAME@ replaced
// (and the lines of unset optional fields left out), with no @NAME@ left over.
TEST(SlurmCli, ScriptIsTheTemplateFilledIn) {
  const std::string templ = read_file(fs::path(kSource) / "slurm" / "fastudy.sbatch.in");
  const auto sbatch_at = templ.find("\n#SBATCH ");
  ASSERT_NE(sbatch_at, std::string::npos);
  ASSERT_EQ(templ.rfind("#!/bin/bash\n", 0), 0u);
  // The template filled by hand: optional fields not in `fields` drop their line.
  const auto fill = [&](const std::vector<std::pair<std::string, std::string>>& fields) {
    std::istringstream in(templ.substr(sbatch_at + 1));
    std::string filled;
    for (std::string line; std::getline(in, line);) {
      bool drop = false;
      for (const std::string optional : {"GPUS_PER_NODE", "CPUS_PER_TASK", "PARTITION", "ACCOUNT"}) {
        const bool given = std::any_of(fields.begin(), fields.end(), [&](const auto& f) { return f.first == optional; });
        drop = drop || (!given && line.find("@" + optional + "@") != std::string::npos);
      }
      if (drop) continue;
      for (const auto& [name, value] : fields) {
        const std::string field = "@" + name + "@";
        for (auto at = line.find(field); at != std::string::npos; at = line.find(field, at + value.size()))
          line.replace(at, field.size(), value);
      }
      filled += line + "\n";
    }
    return filled;
  };
  // Any @NAME@ (upper case and _) left in a written script.
  const auto leftover_field = [](const std::string& s) {
    for (std::size_t at = s.find('@'); at != std::string::npos; at = s.find('@', at + 1)) {
      std::size_t end = at + 1;
      while (end < s.size() && (std::isupper(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
      if (end > at + 1 && end < s.size() && s[end] == '@') return s.substr(at, end + 1 - at);
    }
    return std::string();
  };

  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 2));
  const std::string exe = "'" + fs::canonical(FASTUDY_EXE).string() + "'";
  struct Case {
    std::string args;
    std::vector<std::pair<std::string, std::string>> fields;
  };
  const Case cases[] = {
      {"--nodes 2 --ntasks-per-node 4 --gpus-per-node 4 --time 01:00:00 --partition gpu --account proj_1 --launcher srun",
       {{"STUDY", "slurm-cli"}, {"NODES", "2"}, {"TASKS_PER_NODE", "4"}, {"GPUS_PER_NODE", "4"}, {"TIME", "01:00:00"},
        {"PARTITION", "gpu"}, {"ACCOUNT", "proj_1"}, {"OUT", out}, {"LEAD", "360"}, {"FASTUDY_QUOTED", exe},
        {"GRID_QUOTED", "'" + grid + "'"}, {"OUT_QUOTED", "'" + out + "'"}, {"LAUNCHER", "srun"}}},
      {"--ntasks-per-node 2 --time 00:05:00 --launcher mpirun --force",
       {{"STUDY", "slurm-cli"}, {"NODES", "1"}, {"TASKS_PER_NODE", "2"}, {"TIME", "00:05:00"}, {"OUT", out},
        {"LEAD", "60"}, {"FASTUDY_QUOTED", exe}, {"GRID_QUOTED", "'" + grid + "'"}, {"OUT_QUOTED", "'" + out + "'"},
        {"LAUNCHER", "mpirun"}}},
  };
  for (const auto& c : cases) {
    RunResult r = run_fastudy("slurm " + grid + " " + c.args);
    ASSERT_EQ(r.code, 0) << c.args << ": " << r.output;
    const std::string s = read_file(fs::path(out) / "fastudy.sbatch");
    const auto header_end = s.find("\n#SBATCH ");
    ASSERT_NE(header_end, std::string::npos) << s;
    // fastudy's header replaces the template's comment; it is all comment lines.
    const std::string header = s.substr(0, header_end + 1);
    EXPECT_EQ(header.rfind("#!/bin/bash\n# fastudy sbatch script for study 'slurm-cli'", 0), 0u) << header;
    EXPECT_EQ(header.find("\n#SBATCH"), std::string::npos) << header;
    EXPECT_EQ(header.find("sbatch template"), std::string::npos) << "the template's own comment leaked:\n" << header;
    EXPECT_EQ(s.substr(header_end + 1), fill(c.fields)) << c.args;
    EXPECT_EQ(leftover_field(s), "") << c.args << "\n" << s;
    EXPECT_EQ(run_command("bash -n " + out + "/fastudy.sbatch").code, 0) << c.args;
  }
}

TEST(SlurmCli, ValidationErrorsExitTwoAndWriteNothing) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 2));
  const std::pair<std::string, std::string> cases[] = {
      {"--nodes 3 --ntasks-per-node 1", "3 ranks cannot be split into groups of ranks_per_variant = 2"},
      {"--time 1:00", "HH:MM:SS"},
      {"--time 00:61:00", "below 60"},
      {"--time 1-24:00:00", "below 24"},
      {"--time 00:00:00", "positive"},
      {"--time 1h", "HH:MM:SS"},
      {"--launcher ssh", "srun or --launcher mpirun"},
      {"--partition 'a b'", "not a Slurm name"},
      {"--nodes 0", "--nodes must be >= 1"},
      {"--gpus-per-node -1", "--gpus-per-node must be >= 0"},
      {"--out '" + out + " 2'", "cannot hold"},
  };
  for (const auto& [args, message] : cases) {
    std::string all = args;
    if (args.find("--time") == std::string::npos) all += " --time 00:10:00";
    if (args.find("--nodes") == std::string::npos) all += " --ntasks-per-node 2";
    RunResult r = run_fastudy("slurm " + grid + " " + all);
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << ": " << r.output;
    EXPECT_FALSE(fs::exists(out)) << args << " wrote " << out;
    EXPECT_FALSE(fs::exists(out + " 2")) << args << " wrote " << out << " 2";
  }
}

TEST(SlurmCli, OutputDirectoryStaysAStudy) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 1));
  ASSERT_EQ(run_fastudy("slurm " + grid + " --time 00:10:00").code, 0);
  // Slurm's log lands there too before fastudy runs.
  std::ofstream(fs::path(out) / "slurm-1.out") << "log\n";
  // A second `fastudy slurm` follows the output-directory policy of every phase.
  RunResult again = run_fastudy("slurm " + grid + " --time 00:10:00");
  EXPECT_EQ(again.code, 2) << again.output;
  EXPECT_NE(again.output.find("--resume"), std::string::npos) << again.output;
  EXPECT_EQ(run_fastudy("slurm " + grid + " --time 00:20:00 --resume").code, 0);
  // What the job runs, and what a user runs by hand afterwards.
  RunResult train = run_fastudy("train " + grid + " --out " + out + " --resume -q");
  EXPECT_EQ(train.code, 0) << train.output;
  EXPECT_NE(read_file(fs::path(out) / "status.csv").find("s2,done,4"), std::string::npos);
  EXPECT_TRUE(fs::exists(fs::path(out) / "slurm-1.out"));
}

TEST(SlurmCli, SubmitWithoutSbatchExitsOneWithHint) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 1));
  RunResult r = run_command("env PATH=" + dir.str() + " " + std::string(FASTUDY_EXE) + " slurm " + grid +
                            " --time 00:10:00 --submit");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("sbatch is not on PATH"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hint: run `sbatch " + out + "/fastudy.sbatch`"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(out) / "fastudy.sbatch"));
}

// The batch script's own logic, with bash and stand-ins: `mpirun` runs its command once (one rank),
// `scontrol` records what it was asked. A SIGUSR1 to the batch shell mid-run must reach fastudy, which
// checkpoints and stops; the shell then requeues the job. A SIGTERM (scancel, the time limit) stops
// fastudy the same way but does not requeue. The last run resumes, ends with exit 0 and no requeue.
TEST(SlurmCli, ScriptForwardsTheSignalAndRequeues) {
  TempDir dir;
  const std::string out = (dir / "out").string();
  const std::string grid = dir.file("grid.toml", grid_text(out, 1, 400, 100));
  ASSERT_EQ(run_fastudy("slurm " + grid + " --time 00:10:00 --launcher mpirun").code, 0);
  const fs::path bin = dir / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "mpirun") << "#!/bin/bash\n# stand-in: mpirun -n N CMD... runs CMD once\nshift 2\nexec \"$@\"\n";
  std::ofstream(bin / "scontrol") << "#!/bin/bash\necho \"$@\" >> " << dir.str() << "/scontrol.calls\n";
  fs::permissions(bin / "mpirun", fs::perms::owner_all);
  fs::permissions(bin / "scontrol", fs::perms::owner_all);
  const std::string env = "env PATH=" + bin.string() + ":/usr/bin:/bin SLURM_JOB_ID=42 SLURM_NTASKS=1 ";
  const std::string script = out + "/fastudy.sbatch";
  // Complete checkpoints of every variant: the readiness event. One more than before the script started
  // means fastudy is training (its signal handlers and the script's traps are installed).
  const auto checkpoints = [&] {
    int n = 0;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(out, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".h5") == 0) ++n;
    }
    return n;
  };

  // Runs the script as a child with its output in `log_name`, sends `sig` to the batch shell once a new
  // checkpoint exists, waits for the shell to end and returns its output.
  const auto run_and_signal = [&](int sig, const std::string& log_name) {
    const std::string log = dir.str() + "/" + log_name;
    const int before = checkpoints();
    const pid_t pid = spawn_logged({"/usr/bin/env", "PATH=" + bin.string() + ":/usr/bin:/bin", "SLURM_JOB_ID=42",
                                    "SLURM_NTASKS=1", "bash", script},
                                   log);
    EXPECT_GT(pid, 0);
    if (pid <= 0) return std::string();
    int status = 0;
    bool ended = false;
    while (checkpoints() <= before) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        ended = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling interval, not a synchronisation
    }
    EXPECT_FALSE(ended) << "the script ended before writing a checkpoint:\n" << read_file(log);
    if (!ended) {
      EXPECT_EQ(::kill(pid, sig), 0);
      EXPECT_EQ(waitpid(pid, &status, 0), pid);
    }
    return read_file(log);
  };

  const std::string out1 = run_and_signal(SIGUSR1, "run1.log");
  EXPECT_NE(out1.find("SIGUSR1 received"), std::string::npos) << out1;
  EXPECT_NE(out1.find("stopped by a signal; run the same command with --resume"), std::string::npos) << out1;
  EXPECT_NE(out1.find("requeueing job 42"), std::string::npos) << out1;
  EXPECT_EQ(read_file(dir / "scontrol.calls"), "requeue 42\n");
  EXPECT_EQ(read_file(fs::path(out) / "status.csv").find("s1,done,400"), std::string::npos)
      << "the signal came too late to test anything";

  const std::string out2 = run_and_signal(SIGTERM, "run2.log");
  EXPECT_NE(out2.find("SIGTERM received"), std::string::npos) << out2;
  EXPECT_NE(out2.find("stopped by a signal; run the same command with --resume"), std::string::npos) << out2;
  EXPECT_NE(out2.find("fastudy exited with code 1"), std::string::npos) << out2;
  EXPECT_EQ(read_file(fs::path(out) / "status.csv").find("s2,done,400"), std::string::npos)
      << "the signal came too late to test anything";
  EXPECT_EQ(read_file(dir / "scontrol.calls"), "requeue 42\n") << "a SIGTERM must not requeue";

  RunResult run3 = run_command(env + "bash " + script);
  EXPECT_EQ(run3.code, 0) << run3.output;
  EXPECT_NE(run3.output.find("fastudy exited with code 0"), std::string::npos) << run3.output;
  EXPECT_EQ(read_file(dir / "scontrol.calls"), "requeue 42\n");
  const std::string status = read_file(fs::path(out) / "status.csv");
  EXPECT_NE(status.find("s1,done,400"), std::string::npos) << status;
  EXPECT_NE(status.find("s2,done,400"), std::string::npos) << status;
}

namespace {

// `s` as one sh word ('...' with ' written as '\''; a newline inside quotes is kept), for run_command.
std::string sq(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The NUL-separated words of a file written by printf '%s\0' "$@".
std::vector<std::string> nul_words(const fs::path& p) {
  const std::string text = read_file(p);
  std::vector<std::string> words;
  std::string w;
  for (char c : text) {
    if (c == '\0') {
      words.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  return words;
}

}  // namespace

// Issue 28, item 3: everything fastudy writes into the script is a shell word or a validated value.
// A grid path and a study name with newlines, $(...), backticks, quotes and ';', and an output
// directory with $(...), backticks and ';' (what an #SBATCH line can hold): the script passes
// `bash -n`, all its #SBATCH lines come before its first command, running it under bash (with a
// stand-in srun that records its arguments) runs nothing else and hands fastudy the exact paths, and
// its "Regenerate:" command reads back as the exact command line. No marker file is ever created.
TEST(SlurmCli, HostilePathsAndNamesAreQuotedAndRunNothing) {
  TempDir dir;
  const fs::path run = dir / "run";  // the working directory of everything the test runs: markers land here
  fs::create_directories(run);
  const std::string hostile_dir = (dir / "g\nid>pwned\n$(touch M1)`touch M2`;touch M3 'q\" \\").string();
  fs::create_directories(hostile_dir);
  const std::string out = (dir / "o$(touch${IFS}M6)`touch${IFS}M7`;touch${IFS}M8").string();
  const std::string grid = hostile_dir + "/grid.toml";
  const std::vector<std::string> argv{FASTUDY_EXE, "slurm", grid, "--out", out, "--time", "00:10:00"};
  std::string cmd = "cd " + sq(run.string()) + " &&";
  for (const auto& a : argv) cmd += " " + sq(a);
  // A study name with a newline, $(...), backticks and ';' never reaches the script: the naming rule
  // (src/core/names.hpp) refuses it at load, naming the key, and nothing is written.
  std::string text = grid_text(out, 1);
  std::string hostile_name = text;
  hostile_name.replace(hostile_name.find("name = \"slurm-cli\""), 18,
                       "name = \"n\\nid>pwned2\\n$(touch${IFS}M4)`touch${IFS}M5`;'\"");
  std::ofstream(grid) << hostile_name;
  RunResult refused = run_command(cmd);
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("[study] name"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("control character"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(out + "/fastudy.sbatch"));
  // The hostile grid path and output directory are quoted.
  std::ofstream(grid, std::ios::trunc) << text;
  RunResult r = run_command(cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string script = out + "/fastudy.sbatch";
  const std::string s = read_file(script);

  // sbatch reads #SBATCH lines only up to the first line that is not a comment.
  const auto last_sbatch = s.rfind("\n#SBATCH ");
  ASSERT_NE(last_sbatch, std::string::npos);
  std::istringstream lines(s.substr(0, last_sbatch + 1));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) EXPECT_EQ(line.rfind('#', 0), 0u) << "line " << n + 1 << ": " << line;
  EXPECT_GE(n, 15);
  EXPECT_TRUE(has_line(s, "#SBATCH --output=" + out + "/slurm-%j.out")) << s;
  EXPECT_EQ(run_command("cd " + sq(run.string()) + " && bash -n " + sq(script)).code, 0);

  // Run it: srun records its arguments; nothing else may run.
  const fs::path bin = dir / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "srun") << "#!/bin/bash\nprintf '%s\\0' \"$@\" > " << sq((dir / "srun.args").string()) << "\n";
  fs::permissions(bin / "srun", fs::perms::owner_all);
  r = run_command("cd " + sq(run.string()) + " && env PATH=" + sq(bin.string()) + ":/usr/bin:/bin SLURM_JOB_ID=7 bash " +
                  sq(script));
  EXPECT_EQ(r.code, 0) << r.output;
  const std::vector<std::string> srun = nul_words(dir / "srun.args");
  ASSERT_EQ(srun.size(), 8u) << r.output;
  EXPECT_EQ(srun[3], "run");
  EXPECT_EQ(srun[4], grid);
  EXPECT_EQ(srun[5], "--out");
  EXPECT_EQ(srun[6], out);
  EXPECT_EQ(srun[7], "--resume");

  // The "Regenerate:" comment is the command line as shell words.
  const auto regen_at = s.find("\n# Regenerate: ");
  ASSERT_NE(regen_at, std::string::npos);
  const std::string regen = s.substr(regen_at + 15, s.find('\n', regen_at + 1) - regen_at - 15);
  std::ofstream(dir / "regen.sh") << "printf '%s\\0' " << regen << " > " << sq((dir / "regen.args").string()) << "\n";
  EXPECT_EQ(run_command("cd " + sq(run.string()) + " && bash " + sq((dir / "regen.sh").string())).code, 0);
  EXPECT_EQ(nul_words(dir / "regen.args"), argv);

  // No marker anywhere: not in the working directory, not beside the script or the grid.
  EXPECT_TRUE(fs::is_empty(run)) << fs::directory_iterator(run)->path();
  for (const auto& e : fs::recursive_directory_iterator(dir.str())) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.rfind("pwned", 0) != 0 && !(name.size() == 2 && name[0] == 'M')) << e.path();
  }
}
