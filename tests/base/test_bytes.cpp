// The byte codec of messages between ranks (base/bytes.hpp): values and strings read back as written,
// in order, and truncated input is an Error naming what was read, never a read past the end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "base/bytes.hpp"
#include "base/error.hpp"

namespace fastudy {
namespace {

TEST(Bytes, ValuesAndStringsRoundTripInOrder) {
  ByteWriter w;
  w.put<std::uint64_t>(0xfedcba9876543210ull);
  w.put_string("flash");
  w.put<double>(-0.0);
  w.put<double>(std::numeric_limits<double>::quiet_NaN());
  w.put_string("");
  w.put<std::int64_t>(-3);
  w.put_string(std::string("a\0b", 3));  // bytes, not a C string
  const double xs[2] = {1.5, 0x1p-1074};
  w.put_bytes(xs, sizeof xs);
  EXPECT_EQ(w.bytes().size(), 8u + (8 + 5) + 8 + 8 + 8 + 8 + (8 + 3) + 16);

  const std::string bytes = w.take();
  ByteReader r(bytes, "test bytes");
  EXPECT_EQ(r.get<std::uint64_t>(), 0xfedcba9876543210ull);
  EXPECT_EQ(r.get_string(), "flash");
  const double zero = r.get<double>();
  EXPECT_EQ(zero, 0.0);
  EXPECT_TRUE(std::signbit(zero));
  EXPECT_TRUE(std::isnan(r.get<double>()));
  EXPECT_EQ(r.get_string(), "");
  EXPECT_FALSE(r.done());
  EXPECT_EQ(r.get<std::int64_t>(), -3);
  EXPECT_EQ(r.get_string(), std::string("a\0b", 3));
  double ys[2] = {0, 0};
  r.get_bytes(ys, sizeof ys);
  EXPECT_EQ(ys[0], 1.5);
  EXPECT_EQ(ys[1], 0x1p-1074);
  EXPECT_TRUE(r.done());
}

// Every cut of a valid message short of its end fails with the reader's name in the message.
TEST(Bytes, TruncatedInputIsAnErrorNamingIt) {
  ByteWriter w;
  w.put<std::int32_t>(7);
  w.put_string("sdpa_flash");
  const std::string whole = w.take();
  for (std::size_t cut = 0; cut < whole.size(); ++cut) {
    const std::string part = whole.substr(0, cut);
    ByteReader r(part, "microbench: the records a rank sent");
    try {
      r.get<std::int32_t>();
      r.get_string();
      ADD_FAILURE() << "no error at cut " << cut;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("microbench: the records a rank sent: truncated"), std::string::npos)
          << e.what();
    }
  }
}

// A length field larger than what is left (a corrupt or foreign message) is refused before any
// allocation of that size.
TEST(Bytes, ALengthBeyondTheEndIsRefused) {
  ByteWriter w;
  w.put<std::uint64_t>(std::numeric_limits<std::uint64_t>::max());
  const std::string bytes = w.take();
  ByteReader r(bytes, "state");
  EXPECT_THROW(r.get_string(), Error);
}

}  // namespace
}  // namespace fastudy
