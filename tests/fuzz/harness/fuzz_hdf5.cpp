// libFuzzer: an HDF5 file as h5py writes checkpoints, opened and read through io::TensorFile as fastudy
// reads imported files: libhdf5 parses it in the reader process (src/io/hdf5_reader.hpp), whose crash
// (libhdf5's bugs on crafted files) is a UsageError naming the file, not a finding; the walk (links
// checked, each object once), the checks of every dataset and the protocol around them are this
// harness's.
#include <sanitizer/common_interface_defs.h>

#include "fuzz_common.hpp"
#include "fuzz_tensor_file.hpp"
#include "src/io/hdf5_reader.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // In the reader: no report of libFuzzer's for a crash there (the program names it instead).
  fastudy::io::start_hdf5_reader([] { __sanitizer_set_death_callback(nullptr); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fastudy::fuzz::read_every_tensor(fastudy::fuzz::write_input("model.h5", data, size));
  return 0;
}
