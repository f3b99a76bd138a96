#include "base/log.hpp"

#include <iostream>
#include <mutex>

namespace fastudy::log {
namespace {
Level g_level = Level::info;
bool g_console = true;
std::mutex g_mutex;
int g_problems = 0;  // under g_mutex
}  // namespace

Level level() { return g_level; }
void set_level(Level l) { g_level = l; }
void set_console(bool owns) { g_console = owns; }
bool owns_console() { return g_console; }

void info(const std::string& line) {
  if (!g_console || g_level < Level::info) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::cout << (line + '\n') << std::flush;
}
void debug(const std::string& line) {
  if (!g_console || g_level < Level::debug) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::cout << ("debug: " + line + '\n') << std::flush;
}
void warn(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_problems;
  std::cerr << ("warning: " + line + '\n') << std::flush;  // one write: mpirun may interleave another rank's between two
}
void error(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_problems;
  std::cerr << ("error: " + line + '\n') << std::flush;
}
int problems_printed() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_problems;
}

}  // namespace fastudy::log
