// The sections of an imported study (internal to src/core's config files; includes toml++): [import]
// (the path pattern, the steps, the tensor-name mapping) and [axes.NAME] (the user's own axes), read
// and validated against the grid, and their resolved TOML. The public view is config.hpp's
// ImportConfig, Study::declared_axes and study_axis().
#pragma once

#include <string>

#include <toml++/toml.h>

#include "src/core/config.hpp"
#include "src/core/config_section.hpp"

namespace fastudy::config_detail {

// [import] into st.import, its path made absolute against the folder of `file` (the grid file).
void read_import(Section imp, Study& st, const std::string& file);
// [axes.NAME] tables into st.declared_axes. A name of the axis table may declare a baseline only (its
// role and replicate flag are fixed); a new name needs a role. Only in a study with [import].
void read_declared_axes(Section axes, Study& st, const std::string& file);
// After [grid] is read: every placeholder of the pattern is a grid axis or {step}, every axis with
// more than one value is in the pattern, a declared baseline is one of its axis's values, and a study
// without {step} lists one step. `root` locates the keys in errors.
void check_import_against_grid(const Study& st, const toml::table& root, const std::string& file);
// The sections of a training study that an imported one must not have (they would be ignored).
void refuse_training_sections(const toml::table& root, const std::string& file);

// The resolved [import] and [axes] tables (only for an imported study).
void add_import_tables(const Study& st, toml::table& resolved);
// An imported variant's resolved TOML: its id, axis values and the pattern its files come from.
std::string imported_variant_toml(const Study& st, const Variant& var);

}  // namespace fastudy::config_detail
