// The byte codec's error on truncated input (base/bytes.hpp).
#include "base/bytes.hpp"

#include "base/error.hpp"

namespace fastudy {

void ByteReader::need(std::uint64_t n) const {
  if (n > in_.size() - at_)
    throw Error(what_ + ": truncated (" + std::to_string(n) + " more bytes expected at offset " + std::to_string(at_) +
                " of " + std::to_string(in_.size()) + ")");
}

}  // namespace fastudy
