// named_variant() and state_at(): the arguments `fastudy replay` and `fastudy bisect` share.
#include "jobs/explain_common.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "base/log.hpp"
#include "jobs/job.hpp"
#include "src/io/checkpoint.hpp"
#include "src/train/explain.hpp"
#include "src/train/trainer.hpp"

namespace fastudy {

const Variant& named_variant(const Study& st, const std::string& option, const std::string& id) {
  if (id.empty()) throw UsageError(option + " is required", "name a variant of the study (variants.csv lists them)");
  if (const Variant* v = st.find_variant(id)) return *v;
  std::string known;
  for (const auto& w : st.variants) known += (known.empty() ? "" : ", ") + w.id;
  throw UsageError(option + " " + id + ": no variant of that id in the study", "variants: " + known);
}

TrainState state_at(const std::string& out, const Variant& v, std::int64_t step, const std::string& option,
                    bool on_from_earlier) {
  if (step == kNoStep) throw UsageError(option + " is required: the step to start from", "use 0 (the initial weights) or a step with a checkpoint");
  if (step < 0)
    throw UsageError(option + " " + std::to_string(step) + " is not a step: steps count from 0 (the initial weights)",
                     "use 0 or a step with a checkpoint");
  if (step == 0) return initial_state(v);
  const std::vector<std::int64_t> have = list_checkpoint_steps(checkpoint_dir(out, v.id));
  std::string steps;
  for (std::int64_t s : have) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
  const std::string hint = have.empty() ? "variant " + v.id + " has no checkpoint yet: train it first (fastudy train GRID --variant " + v.id + ")"
                                        : "steps with a checkpoint of " + v.id + ": 0 (initial weights), " + steps;
  if (step > v.train.steps)
    throw UsageError(option + " " + std::to_string(step) + ": variant " + v.id + " trains " + std::to_string(v.train.steps) + " steps", hint);
  if (on_from_earlier && std::find(have.begin(), have.end(), step) == have.end()) {
    std::int64_t before = 0;
    for (std::int64_t s : have)
      if (s < step) before = s;
    log::info(option + " " + std::to_string(step) + ": no checkpoint of " + v.id + " there; training it on from step " +
              std::to_string(before));
    return advance_state(v, state_at(out, v, before, option), step);
  }
  const std::string path = checkpoint_path(out, v.id, step);
  if (std::find(have.begin(), have.end(), step) == have.end())
    throw UsageError(option + " " + std::to_string(step) + ": variant " + v.id + " has no checkpoint at step " + std::to_string(step) + " (" + path + ")", hint);
  if (auto problem = checkpoint_problem(path))
    throw UsageError(option + " " + std::to_string(step) + ": the checkpoint " + path + " is not usable: " + *problem,
                     "fastudy train GRID --resume repairs damaged checkpoints");
  TrainState s = read_checkpoint(path);
  if (s.attrs["config_hash"] != v.hash)
    throw UsageError(option + " " + std::to_string(step) + ": " + path + " was written with another configuration of " + v.id,
                     "train the study again (fastudy train GRID --resume --force)");
  return s;
}

}  // namespace fastudy
