// Tampering with a study's checkpoints from a test, the way a careless or hostile user would: a root
// attribute rewritten and the file sealed again, so that no checksum tells (tests linked with fastudy_io).
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>

#include "base/checksum.hpp"
#include "src/io/h5.hpp"

namespace fastudy::test {

// Sets a root string attribute of a checkpoint and writes its sidecar again (a valid one).
inline void retag(const std::string& path, const std::string& attr, const std::string& value) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Adelete(f, attr.c_str()), 0);
  H5Fclose(f);
  h5::File::open(path, true, nullptr).root().set_attr(attr, value);
  write_checksum(path);
  ASSERT_FALSE(checksum_problem(path).has_value());
}

}  // namespace fastudy::test
