// Where checkpoints live and which exist: their paths, the steps of a variant's files, the steps the
// trainer writes (checkpoint_schedule), the first damaged one, removal from a step on, and the newest
// valid one (see checkpoint.hpp).
#include "src/io/checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <regex>
#include <sstream>

#include "base/checksum.hpp"
#include "base/log.hpp"

namespace fastudy {
namespace fs = std::filesystem;

std::string checkpoint_dir(const std::string& out, const std::string& variant_id) {
  return (fs::path(out) / "checkpoints" / variant_id).string();
}

std::string checkpoint_path(const std::string& out, const std::string& variant_id, std::int64_t step) {
  if (step < 0 || step > 9999999) {
    throw UsageError("checkpoint step " + std::to_string(step) + " does not fit the 7-digit file name");
  }
  std::ostringstream name;
  name << "step_" << std::setw(7) << std::setfill('0') << step << ".h5";
  return (fs::path(checkpoint_dir(out, variant_id)) / name.str()).string();
}

std::vector<std::int64_t> list_checkpoint_steps(const std::string& dir) {
  static const std::regex pattern(R"(step_(\d{7})\.h5)");
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, pattern)) steps.push_back(std::stoll(m[1].str()));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<std::int64_t> checkpoint_schedule(std::int64_t every, std::int64_t steps) {
  std::vector<std::int64_t> out;
  if (every > 0)
    for (std::int64_t s = every; s < steps; s += every) out.push_back(s);
  if (steps > 0) out.push_back(steps);
  return out;
}

bool is_checkpoint_step(std::int64_t every, std::int64_t steps, std::int64_t step) {
  return step > 0 && step <= steps && ((every > 0 && step % every == 0) || step == steps);
}

std::optional<CheckpointDamage> first_damaged_checkpoint(const std::string& out, const std::string& variant_id,
                                                         const std::vector<std::int64_t>& schedule, std::int64_t upto) {
  for (std::int64_t s : schedule) {
    if (s > upto) break;
    const std::string path = checkpoint_path(out, variant_id, s);
    if (auto problem = checksum_problem(path)) return CheckpointDamage{s, path, *problem};
  }
  return std::nullopt;
}

std::vector<std::string> remove_checkpoints_from(const std::string& out, const std::string& variant_id,
                                                 std::int64_t from) {
  std::vector<std::string> removed;
  for (std::int64_t s : list_checkpoint_steps(checkpoint_dir(out, variant_id))) {
    if (s < from) continue;
    const std::string path = checkpoint_path(out, variant_id, s);
    std::error_code ec;
    fs::remove(path, ec);
    remove_checksum(path);
    removed.push_back(path);
  }
  return removed;
}

std::optional<CheckpointRef> latest_valid_checkpoint(const std::string& dir, std::vector<std::string>* skipped) {
  auto report = [&](const std::string& line) {
    if (skipped) {
      skipped->push_back(line);
    } else {
      log::warn("skipping " + line);
    }
  };
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().find(".h5.tmp.") != std::string::npos) {
      report(e.path().string() + ": temporary file of an interrupted checkpoint write");
    }
  }
  std::vector<std::int64_t> steps = list_checkpoint_steps(dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string path = (fs::path(dir) / fs::path(checkpoint_path("", "", *it)).filename()).string();
    if (auto problem = checkpoint_problem(path)) {
      report(path + ": " + *problem);
      continue;
    }
    return CheckpointRef{*it, path};
  }
  return std::nullopt;
}

}  // namespace fastudy
