#include "base/error.hpp"

#include <atomic>

namespace fastudy {

namespace {
std::atomic<int> g_process_rank{-1};
}

int process_rank() { return g_process_rank.load(); }
void set_process_rank(int rank) { g_process_rank.store(rank); }

}  // namespace fastudy
