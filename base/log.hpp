// Console output with one verbosity setting: -q (errors only), default, -v (debug). Only the
// process that owns the console (rank 0 of an MPI run) prints info lines; errors print everywhere.
#pragma once

#include <iostream>
#include <sstream>
#include <string>

namespace fastudy::log {

enum class Level { quiet = 0, info = 1, debug = 2 };

Level level();
void set_level(Level l);
// Whether this process prints info/debug lines (set false on non-zero MPI ranks).
void set_console(bool owns_console);
bool owns_console();

void info(const std::string& line);
void debug(const std::string& line);
void warn(const std::string& line);   // always printed, prefixed "warning: "
void error(const std::string& line);  // always printed, prefixed "error: "

}  // namespace fastudy::log
