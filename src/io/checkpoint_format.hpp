// What the checkpoint writer (checkpoint_write.cpp) and readers (checkpoint_read.cpp) share: the
// names of the format and the checksum of a dataset's bytes. Internal to src/io: checkpoint.hpp is the
// interface and describes the file layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/checksum.hpp"

namespace fastudy::checkpoint_format {

inline constexpr const char* kLossHistory = "loss_history";  // the root dataset of the loss history
inline constexpr const char* kCrcAttr = "crc32";             // every dataset's checksum attribute

// The zlib CRC-32 of n bytes: a dataset's crc32 attribute.
inline std::uint32_t crc_of(const std::byte* p, std::size_t n) { return crc32_update(0, p, n); }

}  // namespace fastudy::checkpoint_format
