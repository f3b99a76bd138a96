// Reading a whole input file that a user names (a grid), safely: only a regular file is read, and only
// up to a size limit, so that a FIFO, a device (/dev/zero, /dev/null), a directory or a huge file is a
// named problem instead of a hang or an exhausted memory.
//
//   std::string problem;
//   std::optional<std::string> text = read_regular_file("grid.toml", 4 << 20, &problem);
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace fastudy {

// The bytes of `path` when it is a regular file (a symbolic link is followed) of at most max_bytes;
// otherwise nullopt and *problem says why, without the path ("is a FIFO (named pipe), not a regular
// file", "is 5.0 GiB, more than the 4.0 MiB a grid file may have", "cannot be opened: No such file or
// directory"). The file is opened without blocking (a FIFO with no writer does not hang the open), its
// kind and size come from fstat of the opened file, and the read stops at max_bytes + 1 bytes, so a
// file that grows while it is read is refused too.
std::optional<std::string> read_regular_file(const std::string& path, std::size_t max_bytes, std::string* problem);

}  // namespace fastudy
