// The resolved configuration as TOML (internal to src/core's config files): a variant's, whose
// content hash is the variant's, and the whole study's (study.toml), whose hash is the study's.
#pragma once

#include <string>

#include "src/core/config.hpp"

namespace fastudy::config_detail {

// [variant] (id, attention, precision, seed, init) and the variant's model, data, train, attention
// and (where not the default) numerics.
std::string variant_toml(const Variant& var);

// Every section with its defaults filled in, then [grid] (and [[grid.vary]]) in the file's order.
std::string resolved_study_toml(const Study& st);

}  // namespace fastudy::config_detail
