// A small RAII layer over the HDF5 C API (parallel build, 1.10): files, groups, datasets, attributes
// and transfer property lists.
//
// Every raw H5* call of the project is made in h5.cpp, exactly once. No link is ever followed into
// another file: every access by name goes through a link access list whose external-link callback
// refuses the traversal (a file another program wrote cannot make fastudy open a third one). A failure becomes an H5Error
// that names the call, the file, the object, the MPI rank, file:line and the innermost messages of
// HDF5's error stack; HDF5's own automatic printing of the stack is switched off.
//
// Files are opened serially (sec2 driver) or on a communicator (MPI-IO driver, collective metadata).
// With MPI-IO, every operation that changes the file's structure (creating groups, datasets,
// attributes) is collective: each rank of the communicator makes the same calls with the same
// arguments. Data transfers use a Transfer: collective (H5FD_MPIO_COLLECTIVE) on a parallel file.
//
// Example (collective over `group`):
//   auto f = h5::File::create("x.h5", &group);
//   auto d = f.root().create_dataset("w", DType::f32, {rows, cols});
//   h5::Transfer xfer(f);                     // collective
//   d.write_rows(my_rows_ptr, row0, nrows, xfer);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hdf5.h>

#include "base/dtype.hpp"
#include "base/error.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy::h5 {

// How many closes failed in this process: of a file, or of an object in it (a group or dataset whose
// header could not be flushed: an I/O error, e.g. a full disk). HDF5 keeps such a file or object open in
// a broken state and crashes when it closes it again at its termination (during MPI_Finalize); main()
// then ends the process without finalizing (jobs/main.cpp).
int failed_closes();

// "H5Dwrite failed on rank 1 (src/io/h5.cpp:210) for 'params/w' in 'out/x.h5': <HDF5 messages>".
class H5Error : public Error {
 public:
  H5Error(std::string call, std::string file, std::string object, const std::string& details,
          const char* src_file, int src_line);
  const std::string& call() const { return call_; }
  const std::string& file() const { return file_; }
  const std::string& object() const { return object_; }
  const std::string& details() const { return details_; }

 private:
  std::string call_, file_, object_, details_;
};

// An owned hid_t, closed with the matching H5*close on destruction. Move-only.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept;
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t id() const { return id_; }
  void reset() noexcept;  // close now (errors on close are ignored here; File::close reports them)
  hid_t release() noexcept;  // give up ownership without closing

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Where an object lives, for error messages.
struct Where {
  std::string file;
  std::string object;  // path inside the file, "/" for the root group
};

class File;

// An object that carries attributes: a group (the root group included) or a dataset.
class Attributed {
 public:
  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, std::int64_t value);
  void set_attr(const std::string& name, double value);
  bool has_attr(const std::string& name) const;
  std::string attr_string(const std::string& name) const;
  std::int64_t attr_int64(const std::string& name) const;
  double attr_double(const std::string& name) const;
  // Names of the attributes whose type is a string.
  std::vector<std::string> string_attr_names() const;
  const Where& where() const { return where_; }
  hid_t id() const { return handle_.id(); }

 protected:
  Attributed(Handle h, Where w) : handle_(std::move(h)), where_(std::move(w)) {}
  Handle handle_;
  Where where_;
};

// A data-transfer property list: collective (H5FD_MPIO_COLLECTIVE) on a parallel file unless
// `collective` is false (H5FD_MPIO_INDEPENDENT); the default list on a serial file. After a write or
// read, io_mode() tells what the MPI-IO layer actually did.
class Transfer {
 public:
  explicit Transfer(const File& file, bool collective = true);
  hid_t id() const { return plist_.id(); }
  bool collective() const { return collective_; }
  // H5Pget_mpio_actual_io_mode after the last transfer: "collective", "chunk-independent",
  // "chunk-collective", "chunk-mixed", "contiguous-collective" or "none" (independent / serial).
  std::string io_mode() const;

 private:
  Handle plist_;
  bool collective_ = false;
};

// The element type a dataset is stored with, as another program (h5py) may have written it: its class
// and size, and for floating-point types the exponent and mantissa widths (IEEE half: 5 and 10,
// bfloat16: 8 and 7, single: 8 and 23, double: 11 and 52).
struct StoredType {
  enum class Class : std::uint8_t { floating, integer, other } cls = Class::other;
  std::size_t bytes = 0;
  int exponent_bits = 0;
  int mantissa_bits = 0;
};

// Where and how a dataset's elements are stored, for readers of files other programs wrote: what
// reading it would touch besides the file itself, and whether every element was ever written.
struct StorageInfo {
  enum class Layout : std::uint8_t { compact, contiguous, chunked, virtual_, other } layout = Layout::other;
  bool allocated = false;          // every element has storage (H5Dget_space_status: allocated)
  std::uint64_t stored_bytes = 0;  // the bytes its elements take in the file (H5Dget_storage_size)
  int filters = 0;                 // compression and other filters (H5Pget_nfilters)
  int external_files = 0;          // raw data kept in other files (H5Pget_external_count)
};

class Dataset : public Attributed {
 public:
  std::vector<std::int64_t> shape() const;  // {} for a scalar dataset, {0} for an empty (null) dataspace
  DType dtype() const;
  std::int64_t numel() const;
  // Rows are the slices along the first dimension (a scalar dataset has one row). Writes/reads rows
  // [row0, row0 + rows) from/to a contiguous buffer; rows may be 0 (then buf may be null), which is
  // how a rank takes part in a collective transfer without data.
  void write_rows(const void* buf, std::int64_t row0, std::int64_t rows, const Transfer& xfer);
  void read_rows(void* buf, std::int64_t row0, std::int64_t rows, const Transfer& xfer) const;
  void read_all(void* buf) const;  // whole dataset, default transfer
  StoredType stored_type() const;
  // Rows [row0, row0 + rows) converted by HDF5 from the stored type (any floating-point or integer
  // layout, fp16 included) to native double or float (round to nearest), default transfer.
  void read_rows_converted(double* buf, std::int64_t row0, std::int64_t rows) const;
  void read_rows_converted(float* buf, std::int64_t row0, std::int64_t rows) const;
  // Byte offset of the dataset's raw data in the file (H5Dget_offset): a contiguous dataset stores its
  // numel() * element size bytes there, in row-major order, in the file's (little-endian) type. -1
  // when there is no such block (no storage allocated yet, or not contiguous).
  std::int64_t file_offset() const;
  StorageInfo storage() const;

 private:
  friend class Group;
  using Attributed::Attributed;
  // converted_to: the memory type to convert to (HDF5's conversion), or -1 for dtype()'s own.
  void transfer(void* buf, std::int64_t row0, std::int64_t rows, hid_t xfer, bool write,
                hid_t converted_to = -1) const;
};

// A link of a group as it is stored, not followed.
struct LinkInfo {
  enum class Type : std::uint8_t { hard, soft, external, other } type = Type::other;
  std::string target;  // soft: the path it names; external: "FILE:OBJECT"; other: the link class number
};

class Group : public Attributed {
 public:
  // New groups track link creation order, so children() lists them in the order they were made.
  Group create_group(const std::string& name);
  Group open_group(const std::string& name) const;
  bool has(const std::string& name) const;  // a direct child link of that name exists
  std::vector<std::string> children() const;  // creation order when tracked, else name order
  // What the child link `name` points to (a soft or external link to nothing is `other`).
  enum class Kind : std::uint8_t { group, dataset, other };
  Kind child_kind(const std::string& name) const;
  LinkInfo link(const std::string& name) const;
  // The object the child link `name` reaches (a hard or soft link, resolved within the file), its kind
  // and its identity: two links to one object have the same file number and address.
  struct Object {
    Kind kind = Kind::other;
    unsigned long fileno = 0;
    std::uint64_t address = 0;
  };
  Object object(const std::string& name) const;
  // A contiguous dataset (no fill: every byte is written by the caller).
  Dataset create_dataset(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape);
  Dataset open_dataset(const std::string& name) const;

 private:
  friend class File;
  using Attributed::Attributed;
  std::string child_path(const std::string& name) const;
};

class File {
 public:
  // comm == nullptr: serial (sec2). Otherwise MPI-IO on *comm, collective; *comm must outlive the file.
  static File create(const std::string& path, const mpi::Comm* comm);  // truncates an existing file
  static File open(const std::string& path, bool writable, const mpi::Comm* comm);
  // H5Fis_hdf5: true when the file has an HDF5 signature (false also for a missing file).
  static bool is_hdf5(const std::string& path);

  Group root() const;
  bool parallel() const { return parallel_; }
  const std::string& path() const { return path_; }
  // Close now and report errors (the destructor closes silently). Collective on a parallel file.
  void close();
  // Gives the file up without closing it: for a parallel file that one rank leaves after an error, where
  // a (collective) close would wait for the other ranks, who do not come. The job ends right after
  // (MPI_Abort), which releases it.
  void abandon() noexcept;

 private:
  File(Handle h, std::string path, bool parallel) : handle_(std::move(h)), path_(std::move(path)), parallel_(parallel) {}
  Handle handle_;
  std::string path_;
  bool parallel_ = false;
};

}  // namespace fastudy::h5
