// A study's checkpoints from a test (tests linked with fastudy_io): their state, compared between runs,
// and tampering the way a careless or hostile user would: a root attribute rewritten and the file sealed
// again, so that no checksum tells.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>

#include "base/checksum.hpp"
#include "src/io/checkpoint.hpp"
#include "src/io/h5.hpp"

namespace fastudy::test {

// A variant's checkpoint as its tensors' bytes (parameters and optimizer state, by name) and its data
// cursor: equal between two runs that computed the same bits (the files' own bytes differ: HDF5
// metadata).
inline std::map<std::string, std::string> final_state(const std::string& out, const std::string& id, std::int64_t step) {
  const TrainState s = read_checkpoint(checkpoint_path(out, id, step));
  std::map<std::string, std::string> m;
  for (const auto* group : {&s.params, &s.optimizer})
    for (const auto& a : *group) m[a.name] = std::string(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  m["#data_cursor"] = std::to_string(s.data_cursor);
  return m;
}

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
