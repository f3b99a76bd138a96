// The files of an imported study ([import], src/core/config.hpp ImportConfig): where every run's
// checkpoint of every step is, what each file holds once its tensor names are mapped, whether the runs
// agree, and their values for the reducer (read by range, never a whole checkpoint at once). Every problem is a UsageError (exit 2) naming the file and
// the tensor, raised before any distance is computed:
//   locate_imports   a listed step without its file, a run lacking a step the others have (the file it
//                    expected), a pattern that matches no file, two files for one run and step
//                    ("step_10" and "step_010");
//   inspect_import   a missing, truncated, damaged or hostile file (io::TensorFile's checks), two stored
//                    names that map to one, a name that is not valid UTF-8 or holds a control character
//                    (it could not be written into the results whole), a tensor that is not floating
//                    point, NaN or Inf in a tensor;
//   check_same_tensors  a tensor present in some runs only, a dtype or shape that differs between runs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/core/config.hpp"
#include "src/io/tensor_file.hpp"

namespace fastudy::io {

// Where every run's files are: paths[v][s] for variant v of the study and steps[s].
struct ImportLayout {
  std::vector<std::int64_t> steps;
  std::vector<std::vector<std::string>> paths;
};
// steps: [import] steps when listed, else every step for which files exist (a run lacking one of them
// is an error, naming the file it expected).
ImportLayout locate_imports(const Study& st);

// One file as provenance records it: path, size and the zlib CRC-32 of its bytes.
struct ImportedFileRecord {
  std::string path;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

// A tensor of an imported file under the study's name.
struct ImportedTensor {
  std::string name;         // the study's name (after strip_prefix, rename)
  std::string stored;       // the file's name
  std::string stored_type;  // the file's word for the dtype ("F32", "BF16", "float32")
  std::vector<std::int64_t> shape;
  std::uint64_t elements = 0;
  bool f64 = false;         // stored as fp64 (the reducer then compares in double)
};

// What one imported checkpoint (a file, or a sharded index with its shards) holds.
struct ImportedFileFacts {
  std::string path;                         // the checkpoint as the pattern named it
  std::vector<ImportedFileRecord> files;    // every file read (the index and its shards)
  std::vector<ImportedTensor> tensors;      // in the file's order, excluded and empty ones left out
  std::uint64_t data_bytes = 0;             // the stored bytes of the kept tensors
  // Bytes for an MPI gather (base/bytes.hpp: every name travels whole, whatever it holds).
  std::string pack() const;
  static ImportedFileFacts unpack(const std::string& bytes);
};

// Opens `path`, maps its tensor names, reads every kept tensor once to check it is finite, and sums
// every file's bytes. Throws UsageError (see the top of this file).
ImportedFileFacts inspect_import(const std::string& path, const ImportConfig& ic);

// Every run holds the same tensors with the same dtype and shape as the first; labels[i] names run i
// in errors ("variant math-fp32-s1"). Throws UsageError naming the runs, the files and the tensor.
void check_same_tensors(const std::vector<ImportedFileFacts>& runs, const std::vector<std::string>& labels);

// The imported checkpoints of one step (paths[v] for variant v), read by range as the reducer asks for
// values. Each file is opened once, at its first request, and kept for the step with its tensors found
// by name (a safetensors or HDF5 file holds only its descriptor and its parsed header; a torch.save
// file, which LibTorch loads whole, its tensors): a request costs a lookup and the read of its range,
// whatever the number of tensors.
class ImportedStep {
 public:
  ImportedStep(const ImportConfig& ic, std::vector<std::string> paths);
  // Values [begin, end) of the tensors `names` (study names, element counts `sizes`) concatenated in
  // this order, of variant v's checkpoint, converted into dst (end - begin values).
  void read(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
            std::uint64_t begin, std::uint64_t end, float* dst);
  void read(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
            std::uint64_t begin, std::uint64_t end, double* dst);

 private:
  template <class T>
  void read_as(std::size_t v, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
               std::uint64_t begin, std::uint64_t end, T* dst);
  // A file opened once, with its tensors by study name.
  struct Opened {
    std::unique_ptr<TensorFile> file;
    std::map<std::string, const TensorEntry*> by_name;
  };
  const Opened& opened(std::size_t v);
  const ImportConfig& ic_;
  std::vector<std::string> paths_;
  std::vector<Opened> opened_;
};

}  // namespace fastudy::io
