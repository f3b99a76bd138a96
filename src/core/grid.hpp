// The grid of a study (internal to src/core's config files; includes toml++): reading [grid] and
// [[grid.vary]] against the axis table, expanding them into variants, and their resolved TOML text.
// The public view of the axis table is config.hpp's grid_axes(), find_grid_axis() and known_axes().
#pragma once

#include <string>
#include <vector>

#include "src/core/config.hpp"
#include "src/core/config_section.hpp"

namespace fastudy::config_detail {

// The axes of [grid], in the order of the file, and its [[grid.vary]] tables, into st.axes,
// st.crossed_axes and st.vary: [grid]'s axes first, then every vary axis (in order of first
// appearance) with its baseline first and then the values the tables list. policy_names: the values
// the policy axis allows (the presets and the study's custom policies).
void read_grid(Section grid, Study& st, const std::vector<std::string>& policy_names, const std::string& file);

// st.variants from st.axes and st.vary, each with its id, resolved TOML and content hash.
void expand_variants(Study& st);

// "\n[grid]\n..." and each "\n[[grid.vary]]\n...", the axes in the file's order, values typed by axis.
std::string grid_toml(const Study& st);

}  // namespace fastudy::config_detail
