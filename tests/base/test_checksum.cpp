// crc32_update (base/checksum.hpp) is zlib's CRC-32 whichever library computes it (libdeflate where the
// build found it, zlib otherwise): the standard check value, and zlib's crc32() itself on buffers of
// every small length, at every alignment, continued piece by piece.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/checksum.hpp"

namespace fastudy {
namespace {

TEST(Crc32, IsZlibsCrc32) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32_update(0, check.data(), check.size()), 0xcbf43926u);  // CRC-32's check value
  EXPECT_EQ(crc32_update(0, nullptr, 0), 0u);

  std::vector<unsigned char> bytes(1 << 20);
  std::mt19937 rng(7);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  const auto zlib = [&](std::size_t at, std::size_t n) {
    return static_cast<std::uint32_t>(::crc32(0, bytes.data() + at, static_cast<uInt>(n)));
  };
  for (std::size_t at = 0; at < 16; ++at)
    for (std::size_t n = 0; n < 300; ++n) ASSERT_EQ(crc32_update(0, bytes.data() + at, n), zlib(at, n)) << at << " " << n;
  EXPECT_EQ(crc32_update(0, bytes.data(), bytes.size()), zlib(0, bytes.size()));
  // Continued: the sum of a file read in pieces of any size.
  std::uint32_t crc = 0;
  for (std::size_t at = 0, piece = 1; at < bytes.size(); at += piece, piece = piece * 3 + 1)
    crc = crc32_update(crc, bytes.data() + at, std::min(piece, bytes.size() - at));
  EXPECT_EQ(crc, zlib(0, bytes.size()));
}

}  // namespace
}  // namespace fastudy
