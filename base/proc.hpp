// Facts about a process from /proc (Linux): the fields of /proc/PID/stat, for the study lock's test of
// whether its holder is alive (state, start time) and for the tests that wait for a process to end.
#pragma once

#include <string>

namespace fastudy {

// Field `n` (3 or more, as proc(5) numbers them) of /proc/PID/stat, "" when the process is gone or the
// field is unknown: 3 is the state (Z a zombie: ended, not yet reaped; X dead), 22 the start time in
// clock ticks since boot.
std::string proc_stat_field(long pid, int n);

}  // namespace fastudy
