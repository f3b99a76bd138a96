// What `fastudy replay` and `fastudy bisect` share: the variant an option names and its state at a
// step (its checkpoint there, or its initial weights at step 0), each refused with a UsageError
// (exit 2) that names the option, the value and what the study has instead.
#pragma once

#include <cstdint>
#include <string>

#include "src/core/config.hpp"
#include "src/core/train_state.hpp"

namespace fastudy {

// The variant `id` of the study (option: "--variant", "--against"); UsageError listing the variants.
const Variant& named_variant(const Study& st, const std::string& option, const std::string& id);

// Variant v's state after `step` steps: its checkpoint OUT/checkpoints/<id>/step_<step>.h5 (read and
// checked whole), or its initial weights for step 0. UsageError (option: "--from", "--step") when
// the step is out of range or has no valid checkpoint, naming the steps that have one. With
// `on_from_earlier`, a step without a checkpoint starts from the latest one before it (or the initial
// weights) and trains on to it (advance_state: the same bits as the original run).
TrainState state_at(const std::string& out, const Variant& v, std::int64_t step, const std::string& option,
                    bool on_from_earlier = false);

}  // namespace fastudy
