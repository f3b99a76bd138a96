// Tensors in files that other programs wrote: what users' frameworks save (PyTorch, JAX, Hugging
// Face), read without their code.
//   safetensors  one file (an 8-byte little-endian header length, a JSON header naming each tensor's
//                dtype, shape and byte range, then the raw buffers), read with positioned reads of the
//                ranges asked for; or a sharded checkpoint's `*.safetensors.index.json` (its
//                `weight_map` names the shard of every tensor), read as one file.
//   HDF5         as h5py writes it: every dataset is a tensor, groups are name prefixes ("a/b/c" is
//                the tensor "a.b.c"); parsed by libhdf5 in a process of its own where the program
//                started one (src/io/hdf5_reader.hpp: libhdf5 can crash on a crafted file).
//   others       readers registered by a higher layer (torch.save files: src/train/torch_file.cpp,
//                through LibTorch), chosen by the file name's extension.
// A file another program wrote is untrusted input. Every reader opens only a regular file (never
// waiting on a FIFO, never reading a device), bounds every parse (JSON nested at most 64 levels, an
// HDF5 group walk that visits each object once and at most 64 groups deep), checks every size,
// shape and offset product for overflow against the bytes that exist, and checks every header before
// any tensor is read: a truncated file, a header whose offsets point past the end, overlap or disagree
// with the dtype and shape, a shard the index names but that lacks the tensor, an HDF5 link or dataset
// whose data lies in another file, or a dataset not every element of which was written, is a
// UsageError naming the file and the tensor. So is any error of a library below (HDF5, LibTorch) and
// a tensor too large for memory: exit 2, never a crash, a hang or a value read from outside the file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/format.hpp"

namespace fastudy::io {

struct TensorEntry {
  std::string name;
  std::optional<Format> format;  // fp64, fp32, fp16 or bf16; nullopt for anything else (integers, fp8, ...)
  std::string stored_type;       // the file's own word for the element type: "BF16", "F32", "I64", "float16"
  std::vector<std::int64_t> shape;
  std::uint64_t elements = 0;    // the product of shape (1 for a scalar)
  std::string file;              // the file that holds the data (a shard of a sharded checkpoint)
};

// Where a tensor's stored bytes lie whole in one file, element after element in the format's own
// layout, read on this machine as its native integers (a safetensors buffer on a little-endian
// machine): the file and the offset of the first byte; the tensor spans elements x the format's bytes.
struct StoredBytes {
  std::string file;
  std::uint64_t offset = 0;
};

// One file format's reader; a TensorFile holds one. Its methods may throw anything (a library's own
// errors included): TensorFile names them.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::vector<TensorEntry>& tensors() const = 0;
  // Every file the tensors come from (an index and its shards), for provenance.
  virtual std::vector<std::string> files() const = 0;
  // Elements [begin, begin + count) of t (one of tensors()) in row-major order, converted: exact into
  // double for every format; into float exact for fp32/fp16/bf16 and rounded to nearest for fp64.
  virtual void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const = 0;
  virtual void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const = 0;
  // Where t's bytes lie (StoredBytes), for a reader of files that hold them so; nullopt otherwise
  // (HDF5's chunks, a torch.save archive).
  virtual std::optional<StoredBytes> stored_bytes(const TensorEntry&) const { return std::nullopt; }
};

class TensorFile {
 public:
  // Opens `path` by its name: *.safetensors, *.safetensors.index.json, *.h5 / *.hdf5, or an extension a
  // reader was registered for. Throws UsageError naming the file for a missing, unreadable, damaged or
  // hostile file (see the top of this file) and for an extension no reader knows.
  static TensorFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return source_->tensors(); }
  const TensorEntry* find(std::string_view name) const;
  std::vector<std::string> files() const { return source_->files(); }
  // Reads t into out (t.elements values). Throws UsageError naming the file and the tensor when t has
  // no floating-point format fastudy reads (format is nullopt) or cannot be read.
  void read(const TensorEntry& t, double* out) const;
  void read(const TensorEntry& t, float* out) const;
  // Elements [begin, begin + count) of t (within t.elements; an Error otherwise), converted as read().
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const;
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const;
  // Where t's bytes lie in its file, when they lie there whole as stored (StoredBytes); nullopt when the
  // reader cannot say (read them with read_range then).
  std::optional<StoredBytes> stored_bytes(const TensorEntry& t) const { return source_->stored_bytes(t); }

 private:
  TensorFile(std::string path, std::unique_ptr<TensorSource> source) : path_(std::move(path)), source_(std::move(source)) {}
  template <class T>
  void checked_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) const;
  std::string path_;
  std::unique_ptr<TensorSource> source_;
};

// A reader for files whose name ends with `extension` (".pt"), registered by a layer that can read
// them (one registration per extension; the last one wins).
using TensorSourceOpener = std::function<std::unique_ptr<TensorSource>(const std::string& path)>;
void register_tensor_format(const std::string& extension, TensorSourceOpener opener);

// The bytes of one element of a stored format (fp64 8, fp32 4, fp16 and bf16 2).
std::size_t stored_element_bytes(Format f);

// The product of `dims` (1 for none), or nullopt when a dimension is negative or the product exceeds
// 2^62 (no file holds that many elements): every reader counts a shape through it.
std::optional<std::uint64_t> checked_elements(const std::vector<std::int64_t>& dims);

namespace detail {
// For the HDF5 reader process (hdf5_reader.hpp), which runs the HDF5 reader of this file:
// f() with every error but a UsageError turned into one naming `file` (and `tensor` when not empty),
// as TensorFile names them; and an HDF5 file opened in this process.
void name_errors(const std::string& file, const std::string& tensor, const std::function<void()>& f);
std::unique_ptr<TensorSource> open_hdf5_here(const std::string& path);
}  // namespace detail

}  // namespace fastudy::io
