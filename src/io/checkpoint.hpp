// Checkpoints: one HDF5 file per variant and step, written collectively by the variant's rank group
// with parallel HDF5, verified, and renamed into place so that a checkpoint is whole or absent.
//
// File layout (format "fastudy-checkpoint/1"; readable with h5dump and h5py):
//   /                       attributes: fastudy_format = "fastudy-checkpoint/1", step, data_cursor,
//                           good_steps (int64), loss_scale (double), and every TrainState::attrs entry
//                           as a UTF-8 string attribute (variant id, axis values, config hash, ...)
//   /params/<name>          one dataset per parameter, named by its module path verbatim
//                           ("blocks.0.attn.qkv.weight"), with the tensor's shape and dtype
//   /optimizer/<name>       optimizer state ("blocks.0.attn.qkv.weight.exp_avg", ...)
//   /extra/<name>           anything else needed to resume exactly (RNG states, ...)
//   /loss_history           float64 [steps]
// Each dataset carries a "crc32" attribute (zlib CRC-32 of its raw little-endian bytes), checked on
// every read; the whole file (root attributes and HDF5 metadata included) is covered by the sidecar
// "<path>.crc" (base/checksum.hpp), checked with plain reads before HDF5 opens the file. The writer
// computes that sidecar without reading the data back: the datasets' CRC-32s (already computed for
// their attributes) are spliced with the CRC-32 of every other byte of the file (HDF5's metadata,
// read back; file_sum_known), which equals a whole-file read whenever the data blocks hold what was
// written — checked by the verification (CheckpointOptions::verify); without it a bad block makes the
// file fail its sidecar check at the next read instead of being sealed as it is.
// Dots in names are kept, not turned into nested groups: the dataset names are exactly the
// trainer's state-dict keys, one flat listing per section (f["params"]["blocks.0.attn.qkv.weight"] in
// h5py). Children keep their creation order, so a round trip preserves the order of each vector.
//
// Paths: OUT/checkpoints/<variant_id>/step_<NNNNNNN>.h5 (7-digit step). A write goes to
// "<path>.tmp.<id>" first; those names are never taken for checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "src/core/train_state.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy {

inline constexpr const char* kCheckpointFormat = "fastudy-checkpoint/1";

// A checkpoint that is missing, truncated, corrupt or of another format. what() names the file (and
// the dataset when one is at fault); hint() says what to do.
class CheckpointError : public Error {
 public:
  CheckpointError(std::string file, std::string dataset, const std::string& problem, std::string hint);
  const std::string& file() const { return file_; }
  const std::string& dataset() const { return dataset_; }

 private:
  std::string file_, dataset_;
};

struct CheckpointOptions {
  // Re-read every rank's share of the written file and check it against its CRC-32 before the
  // rename. Without it the sidecar still records the CRC-32 of the bytes meant to be written, so a
  // write the file system got wrong is caught at the next read (the file reads as damaged), not here.
  bool verify = true;
  bool fsync = true;   // fsync the file and its directory around the rename (survives a power cut)
  // Collective transfers (H5FD_MPIO_COLLECTIVE, the default) let MPI-IO aggregate the ranks' writes,
  // which pays on parallel file systems with many ranks per node. Each rank's share is already one
  // contiguous range of the file, so independent transfers (false) skip a synchronisation per
  // dataset; on a small, loaded node that is faster (see bench/runner). Metadata stays collective.
  bool collective = true;
  // Tensors of at least this many bytes are split over the ranks; smaller ones (biases, norms) are
  // written whole by rank 0 with an independent transfer, which saves a synchronisation each.
  // 0 splits every tensor.
  std::size_t split_bytes = std::size_t{1} << 20;
};

// What one rank saw while writing.
struct CheckpointWriteStats {
  std::int64_t bytes = 0;                  // tensor bytes in the file (all ranks together)
  std::int64_t datasets = 0;               // datasets written
  std::int64_t transfers = 0;              // H5Dwrite calls made by this rank
  std::int64_t collective_transfers = 0;   // of those, transfers MPI-IO reported as collective
  double seconds = 0;                      // wall time of the whole call on this rank, of which:
  double write_seconds = 0;                //   create, write, checksum, close, of which:
  double create_seconds = 0;               //     H5Dcreate of the datasets
  double transfer_seconds = 0;             //     H5Dwrite of the data
  double checksum_seconds = 0;             //     CRC-32 of this rank's shares and their combination
  double close_seconds = 0;                //     crc32 attributes, H5Fclose
  double verify_seconds = 0;               //   re-read and check
  double commit_seconds = 0;               //   sidecar, fsync, rename, of which:
  double sum_seconds = 0;                  //     the file's CRC-32 for the sidecar (rank 0)
};

// Collective over `group`. Every rank passes a TrainState with the same structure (names, shapes,
// dtypes, scalars, attrs) — the data-parallel replicas of one variant; each rank writes its share, a
// contiguous range of rows (first dimension) of every tensor of at least options.split_bytes, with
// collective transfers; rank 0 writes the smaller tensors. Creates the
// parent directory. On return the checkpoint exists at `path` on every rank, or every rank throws
// (CheckpointError on a failed verification, UsageError on inconsistent states, h5::H5Error or
// mpi::MpiError on I/O failures). An old file at `path` is replaced atomically.
CheckpointWriteStats write_checkpoint(const mpi::Comm& group, const std::string& path, const TrainState& s,
                                      const CheckpointOptions& options = {});

// Serial read of a whole checkpoint, every checksum checked. Throws CheckpointError.
TrainState read_checkpoint(const std::string& path);
// Collective over `group`: rank 0 reads and checks, every rank returns the same state or throws the
// same CheckpointError (a resume needs the state on every rank of the group).
TrainState read_checkpoint(const mpi::Comm& group, const std::string& path);

// Whether a read first checks the whole file against its checksum sidecar (a pass over every byte).
// `checked_before` skips that pass, for a file that checkpoint_problem() found intact earlier in the
// same run (reduce checks every checkpoint before any work, then reads each again); the crc32 of
// every dataset read is checked either way.
enum class WholeFile { verify, checked_before };

// Only the parameters (f32 or f64, as stored), in file order; `names` empty means all of them, else
// exactly those (a missing name is a CheckpointError). Checksums are checked. For the reducer.
std::vector<NamedArray> read_params(const std::string& path, const std::vector<std::string>& names = {},
                                    WholeFile whole = WholeFile::verify);

// The parameters of one checkpoint, read by range: the reducer's ranks each read only the windows of
// the tensors they compute, never a whole checkpoint. Opening reads the HDF5 metadata once (where each
// parameter's contiguous little-endian data lies in the file); each read is then a positioned read of
// the file (base/read_file.hpp), converted to the caller's type. For a file found intact
// earlier in the same run (checkpoint_problem): no checksum is checked here. Throws CheckpointError.
class CheckpointParams {
 public:
  explicit CheckpointParams(const std::string& path);
  ~CheckpointParams();
  CheckpointParams(const CheckpointParams&) = delete;
  CheckpointParams& operator=(const CheckpointParams&) = delete;
  // Values [begin, begin + count) of parameter `name` (flattened row-major), converted into out.
  void read(const std::string& name, std::uint64_t begin, std::uint64_t count, float* out) const;
  void read(const std::string& name, std::uint64_t begin, std::uint64_t count, double* out) const;

 private:
  struct Param {
    DType dtype = DType::f32;
    std::uint64_t numel = 0;
    std::uint64_t offset = 0;  // of the data in the file
  };
  template <class T>
  void read_as(const std::string& name, std::uint64_t begin, std::uint64_t count, T* out) const;
  std::string path_;
  std::map<std::string, Param> params_;
  struct Mapping;
  std::unique_ptr<Mapping> map_;
};

// The root attributes only (step, data_cursor and the string attrs: variant id, config hash, ...),
// without reading or checking the tensors: a cheap look, e.g. to refuse a resume whose config hash
// changed. Throws CheckpointError for a missing, truncated or foreign file.
struct CheckpointInfo {
  std::int64_t step = 0;
  std::int64_t data_cursor = 0;
  std::map<std::string, std::string> attrs;
};
// `checked_before`: the caller verified the whole file against its sidecar earlier in the same run.
CheckpointInfo read_checkpoint_info(const std::string& path, WholeFile whole = WholeFile::verify);

// What a checkpoint must say about itself in its root attributes `variant`, `step` and `config_hash`:
// the variant and step its path names (OUT/checkpoints/<variant>/step_<step>.h5) and the configuration
// hash of that variant in the study (study.toml). A checkpoint copied or moved, with its sidecar, into
// another variant's or step's place is a whole file but not that checkpoint; one trained with another
// configuration does not belong to the study as it is now.
struct CheckpointIdentity {
  std::string variant;
  std::int64_t step = 0;
  std::string config_hash;  // "": not compared
};
// nullopt when the attributes in `info` are `want`'s; else what they say instead, naming the attributes.
std::optional<std::string> identity_problem(const CheckpointInfo& info, const CheckpointIdentity& want);

// nullopt when `path` is a complete, valid checkpoint (and, with `want`, that checkpoint: see
// CheckpointIdentity); otherwise the problem (full read, all checksums).
std::optional<std::string> checkpoint_problem(const std::string& path, const CheckpointIdentity* want = nullptr);

// OUT/checkpoints/<variant_id>
std::string checkpoint_dir(const std::string& out, const std::string& variant_id);
// OUT/checkpoints/<variant_id>/step_<NNNNNNN>.h5
std::string checkpoint_path(const std::string& out, const std::string& variant_id, std::int64_t step);
// Steps of the files named step_<NNNNNNN>.h5 in dir, ascending (temporary files excluded; a missing
// dir gives an empty list). Names only: the files are not opened.
std::vector<std::int64_t> list_checkpoint_steps(const std::string& dir);

// The steps at which the trainer writes a checkpoint: every `every` steps (when every > 0) and the
// last step, ascending.
std::vector<std::int64_t> checkpoint_schedule(std::int64_t every, std::int64_t steps);
// Whether a run of `steps` steps with checkpoint_every = `every` writes a checkpoint after `step`: the
// one rule checkpoint_schedule lists and the trainer follows.
bool is_checkpoint_step(std::int64_t every, std::int64_t steps, std::int64_t step);

// The first checkpoint of a variant, among the `schedule` steps up to `upto` (inclusive), that is
// missing, does not match its checksum sidecar, or is not that variant's checkpoint of that step (its
// root attributes, CheckpointIdentity) or, when `config_hash` is given, was trained with another
// configuration; nullopt when all are whole and in place. Plain reads of every byte, and the root
// attributes only through HDF5 (no tensor is read): cheap enough to run over every checkpoint of every
// variant on each resume, status and report.
struct CheckpointDamage {
  enum class Kind { missing, damaged, misplaced, other_configuration };
  Kind kind = Kind::damaged;
  std::int64_t step = 0;
  std::string path;
  std::string problem;
};
std::optional<CheckpointDamage> first_damaged_checkpoint(const std::string& out, const std::string& variant_id,
                                                         const std::vector<std::int64_t>& schedule, std::int64_t upto,
                                                         const std::string& config_hash = {});

// Removes the checkpoints of a variant at steps >= `from` and their sidecars; returns the paths removed.
std::vector<std::string> remove_checkpoints_from(const std::string& out, const std::string& variant_id,
                                                 std::int64_t from);

struct CheckpointRef {
  std::int64_t step = 0;
  std::string path;
};
// The newest checkpoint in dir that reads back whole with valid checksums (and, with `variant_id`, whose
// attributes name that variant and its file's step: CheckpointIdentity). Invalid checkpoints and
// leftover temporary files are skipped, each appended to *skipped ("<path>: <problem>") when given
// (for the caller to report), else reported by log::warn.
std::optional<CheckpointRef> latest_valid_checkpoint(const std::string& dir,
                                                     std::vector<std::string>* skipped = nullptr,
                                                     const std::string& variant_id = {});

}  // namespace fastudy
