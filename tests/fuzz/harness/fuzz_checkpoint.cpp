// libFuzzer: the bytes of a fastudy checkpoint, beside the checksum sidecar of the seed checkpoint (the
// first "*.h5.crc" in a corpus folder): checked as status, reduce and resume check one
// (checkpoint_problem: the whole-file checksum, then the full read and every dataset's crc32) and read
// as the reducer reads its parameters. A damaged checkpoint must be refused by its checksum before HDF5
// sees a byte (libhdf5 crashes on crafted files: fuzz_hdf5), and only with a fastudy::Error naming it.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/checksum.hpp"
#include "fuzz_common.hpp"
#include "src/io/checkpoint.hpp"

namespace {
std::string g_sidecar;  // the seed checkpoint's sidecar text
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  namespace fs = std::filesystem;
  for (int i = 1; i < *argc && g_sidecar.empty(); ++i) {
    std::error_code ec;
    if ((*argv)[i][0] == '-' || !fs::is_directory((*argv)[i], ec)) continue;
    for (const auto& e : fs::directory_iterator((*argv)[i], ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".h5.crc") == 0) {
        std::ifstream in(e.path(), std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        g_sidecar = ss.str();
        break;
      }
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fastudy::fuzz::write_input("step_0000004.h5", data, size);
  fastudy::fuzz::write_input("step_0000004.h5.crc", reinterpret_cast<const std::uint8_t*>(g_sidecar.data()), g_sidecar.size());
  try {
    if (!fastudy::checkpoint_problem(path)) (void)fastudy::read_params(path);
    (void)fastudy::read_checkpoint_info(path);
  } catch (const fastudy::Error&) {
  }
  return 0;
}
