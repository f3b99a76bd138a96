#include "base/log.hpp"

#include <unistd.h>

#include <iostream>
#include <mutex>

namespace fastudy::log {
namespace {
Level g_level = Level::info;
bool g_console = true;
std::mutex g_mutex;
int g_problems = 0;  // under g_mutex
std::string g_status;  // the status line shown on the terminal ("" none), under g_mutex
constexpr const char* kEraseLine = "\r\033[K";  // to the line's start, erase to its end (ANSI)

// Around a line printed while a status line is shown: erase it first, draw it again after.
void before_line() {
  if (!g_status.empty()) std::cout << kEraseLine << std::flush;
}
void after_line() {
  if (!g_status.empty()) std::cout << g_status << std::flush;
}
}  // namespace

Level level() { return g_level; }
void set_level(Level l) { g_level = l; }
void set_console(bool owns) { g_console = owns; }
bool owns_console() { return g_console; }

void info(const std::string& line) {
  if (!g_console || g_level < Level::info) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  before_line();
  std::cout << (line + '\n') << std::flush;  // one write: mpirun may interleave another rank's between two
  after_line();
}
void debug(const std::string& line) {
  if (!g_console || g_level < Level::debug) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  before_line();
  std::cout << ("debug: " + line + '\n') << std::flush;
  after_line();
}
void warn(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_problems;
  before_line();
  std::cerr << ("warning: " + line + '\n') << std::flush;
  after_line();
}
void error(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_problems;
  before_line();
  std::cerr << ("error: " + line + '\n') << std::flush;
  after_line();
}
bool status_on_terminal() { return g_console && g_level >= Level::info && isatty(STDOUT_FILENO) == 1; }
void status(const std::string& text) {
  if (!status_on_terminal()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_status = text;
  std::cout << kEraseLine << g_status << std::flush;
}
void clear_status() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_status.empty()) return;
  std::cout << kEraseLine << std::flush;
  g_status.clear();
}
int problems_printed() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_problems;
}

}  // namespace fastudy::log
