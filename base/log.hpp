// Console output with one verbosity setting: -q (errors only), default, -v (debug). Only the
// process that owns the console (rank 0 of an MPI run) prints info lines; warnings and errors print
// everywhere and at every level, so -q never hides why a job failed (main() checks it: a job that
// exits non-zero without a warning or error line printed gets one). On a terminal a status line
// (status(): progress, base/progress.hpp) stays at the bottom, redrawn in place; other lines printed
// meanwhile go above it.
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
// The status line: shown in place (carriage return, erase line) when stdout is a terminal and this
// process prints info lines, else ignored; clear_status() erases it (at the end of the work).
bool status_on_terminal();
void status(const std::string& text);
void clear_status();
// How many warning and error lines this process has printed (warn, error, and print_error's).
int problems_printed();

}  // namespace fastudy::log
