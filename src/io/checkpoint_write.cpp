// The checkpoint writer (write_checkpoint) over the HDF5 wrapper; see checkpoint.hpp for the file layout,
// checkpoint_read.cpp for the readers and checkpoint_files.cpp for paths and the schedule.
//
// The collective write: every rank creates the same groups/datasets/attributes (collective metadata)
// and writes rows [r*R/P, (r+1)*R/P) of each tensor with R rows on P ranks, with one collective
// transfer per dataset; tensors smaller than CheckpointOptions::split_bytes are written whole by
// rank 0 alone (a collective per bias vector costs more than the write). CRC-32 of a dataset =
// crc32_join (zlib's crc32_combine) over the ranks' shares in rank order, so no rank checksums more
// than its share.
// Then: close, reopen and verify (every rank checks its share against the stored checksum, reading
// independently), fsync, rename by rank 0 once the collective close has completed every rank's
// writes.
#include "src/io/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/hash.hpp"
#include "src/io/checkpoint_format.hpp"
#include "src/io/h5.hpp"

namespace fastudy {
namespace fs = std::filesystem;
namespace {

using checkpoint_format::crc_of;
using checkpoint_format::kCrcAttr;
using checkpoint_format::kLossHistory;

constexpr const char* kSections[] = {"params", "optimizer", "extra"};
const std::vector<std::string> kReservedAttrs = {"fastudy_format", "step", "data_cursor", "good_steps",
                                                 "loss_scale"};

const bool kLittleEndianHost = [] {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}();

std::int64_t rows_of(const std::vector<std::int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }

struct Share {
  std::int64_t row0 = 0, rows = 0;
  std::size_t byte0 = 0, bytes = 0;
};

// Rows [rank*R/P, (rank+1)*R/P) of an array with R rows on P ranks; an array of fewer than
// `split_bytes` bytes is rank 0's alone.
Share share_of(const NamedArray& a, int rank, int size, std::size_t split_bytes) {
  const std::int64_t R = rows_of(a.shape);
  Share s;
  if (a.data.size() < split_bytes) {
    s.rows = rank == 0 ? R : 0;
    s.bytes = rank == 0 ? a.data.size() : 0;
    return s;
  }
  s.row0 = R * rank / size;
  s.rows = R * (rank + 1) / size - s.row0;
  const std::size_t row_bytes = R > 0 ? a.data.size() / static_cast<std::size_t>(R) : 0;
  s.byte0 = static_cast<std::size_t>(s.row0) * row_bytes;
  s.bytes = static_cast<std::size_t>(s.rows) * row_bytes;
  return s;
}

struct Item {
  std::string section;  // "" for a root dataset
  const NamedArray* array;
};

// Everything the collective metadata calls depend on: must be equal on every rank of the group.
std::string structure_of(const TrainState& s, const std::vector<Item>& items) {
  std::ostringstream o;
  o << s.step << ' ' << s.data_cursor << ' ' << s.good_steps << ' ' << s.loss_scale << '\n';
  for (const auto& [k, v] : s.attrs) o << k << '=' << v << '\n';
  for (const auto& it : items) {
    o << it.section << '/' << it.array->name << ' ' << to_string(it.array->dtype);
    for (auto d : it.array->shape) o << ' ' << d;
    o << '\n';
  }
  return o.str();
}

void validate(const TrainState& s, const std::vector<Item>& items) {
  for (const auto& [k, v] : s.attrs) {
    if (std::find(kReservedAttrs.begin(), kReservedAttrs.end(), k) != kReservedAttrs.end()) {
      throw UsageError("checkpoint attribute '" + k + "' is reserved for the format",
                       "rename the TrainState::attrs key");
    }
  }
  std::vector<std::string> seen;
  for (const auto& it : items) {
    const NamedArray& a = *it.array;
    if (a.name.empty() || a.name.find('/') != std::string::npos || a.name == "." || a.name == "..") {
      throw UsageError("checkpoint array name '" + a.name + "' in " + it.section + " is not a valid dataset name",
                       "names are module paths like blocks.0.attn.qkv.weight: no '/' and not empty");
    }
    for (auto d : a.shape) {
      if (d < 0) throw UsageError("checkpoint array '" + a.name + "' has a negative dimension");
    }
    const std::size_t want = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype);
    if (a.data.size() != want) {
      throw UsageError("checkpoint array '" + a.name + "' holds " + std::to_string(a.data.size()) +
                       " bytes but its shape and dtype need " + std::to_string(want));
    }
    std::string key = it.section + "/" + a.name;
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      throw UsageError("checkpoint array '" + key + "' appears twice");
    }
    seen.push_back(std::move(key));
  }
}

std::string dataset_label(const Item& it) {
  return it.section.empty() ? "/" + it.array->name : "/" + it.section + "/" + it.array->name;
}

// Combined CRC of every item from the per-rank partial CRCs (all ranks get the same values).
std::vector<std::uint32_t> combine_crcs(const mpi::Comm& group, const std::vector<Item>& items,
                                        const std::vector<std::uint32_t>& local, std::size_t split_bytes) {
  const int P = group.size();
  std::vector<std::int64_t> all(items.size() * static_cast<std::size_t>(P), 0);
  for (std::size_t i = 0; i < items.size(); ++i) all[i * P + group.rank()] = local[i];
  group.allreduce_sum(all.data(), all.size());
  std::vector<std::uint32_t> out(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    std::uint32_t crc = 0;
    for (int r = 0; r < P; ++r) {
      Share sh = share_of(*items[i].array, r, P, split_bytes);
      crc = crc32_join(crc, static_cast<std::uint32_t>(all[i * P + r]), sh.bytes);
    }
    out[i] = crc;
  }
  return out;
}

// Removes every "<name>.tmp.*" beside `final_path`: the names temporary_path gives it, left behind by
// writes that were killed before their rename.
void remove_stale_tmp(const fs::path& final_path) {
  std::error_code ec;
  const std::string prefix = final_path.filename().string() + ".tmp.";
  for (const auto& e : fs::directory_iterator(final_path.parent_path(), ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove(e.path(), ec);
  }
}

// write_checkpoint runs five phases; every rank of the group makes the same collective calls in the
// same order. Each phase but the write ends with a collective that lets all ranks go on or throw
// together; a failed HDF5 or MPI call inside the write throws h5::H5Error or mpi::MpiError.
//   agree_on_state      allreduce_max    the states are valid and of one structure on every rank
//   prepare_temporary   bcast            the directory exists and every rank knows the temporary name
//   write_temporary     HDF5 + allreduce the temporary file is complete, checksums stored, closed
//   verify_temporary    allreduce_max    every rank's share reads back as written (options.verify)
//   commit_temporary    bcast            rank 0 has renamed the temporary file over the checkpoint

// The loss history as the float64 [steps] dataset /loss_history.
NamedArray loss_history_array(const std::vector<double>& loss_history) {
  NamedArray history;
  history.name = kLossHistory;
  history.dtype = DType::f64;
  history.shape = {static_cast<std::int64_t>(loss_history.size())};
  history.data.resize(loss_history.size() * sizeof(double));
  if (!loss_history.empty()) std::memcpy(history.data.data(), loss_history.data(), history.data.size());
  return history;
}

// Every dataset of the file in write order: /params/*, /optimizer/*, /extra/*, then `history` at the
// root. The items point into `s` and `history`, which must outlive them.
std::vector<Item> items_of(const TrainState& s, const NamedArray& history) {
  std::vector<Item> items;
  for (const auto& a : s.params) items.push_back({"params", &a});
  for (const auto& a : s.optimizer) items.push_back({"optimizer", &a});
  for (const auto& a : s.extra) items.push_back({"extra", &a});
  items.push_back({"", &history});
  return items;
}

// Phase 1, before any collective HDF5 call. Returns on every rank only if every rank's state is valid
// and all have the same structure; otherwise every rank throws a UsageError. One allreduce_max.
void agree_on_state(const mpi::Comm& group, const std::string& path, const TrainState& s,
                    const std::vector<Item>& items) {
  // Validation may fail on some ranks only, and the ranks' structures must agree: settle both with
  // one reduction (max of [invalid, digest, -digest]).
  std::string invalid;
  try {
    validate(s, items);
  } catch (const UsageError& e) {
    invalid = e.what();
  }
  const std::int64_t digest = static_cast<std::int64_t>(fnv1a64(structure_of(s, items)) >> 1);
  std::int64_t agree[3] = {invalid.empty() ? 0 : 1, digest, -digest};
  group.allreduce_max(agree, 3);
  if (agree[0] != 0) {
    throw UsageError(invalid.empty() ? "write_checkpoint('" + path + "'): another rank of the group passed an "
                                       "invalid state"
                                     : invalid);
  }
  if (agree[1] != -agree[2]) {
    throw UsageError("write_checkpoint('" + path + "'): the ranks of the group passed states of different "
                     "structure (names, shapes, dtypes, scalars or attributes differ)",
                     "every rank of a variant's group must hold the same replicated TrainState");
  }
}

// Phase 2. Rank 0 creates the directory, removes temporary files left by interrupted writes of `path`
// and picks a fresh temporary name (temporary_path); one bcast of "T<name>" or "E<error>". Every rank
// returns the same name, or every rank throws a CheckpointError.
std::string prepare_temporary(const mpi::Comm& group, const std::string& path) {
  const fs::path final_path(path);
  std::string setup;
  if (group.is_root()) {
    try {
      if (final_path.has_parent_path()) fs::create_directories(final_path.parent_path());
      remove_stale_tmp(final_path);
      setup = "T" + temporary_path(path);
    } catch (const std::exception& e) {
      setup = std::string("E") + e.what();
    }
  }
  group.bcast(setup);
  if (setup[0] == 'E') {
    throw CheckpointError(path, "", "cannot prepare the directory: " + setup.substr(1),
                          "check that the output directory is writable");
  }
  return setup.substr(1);
}

struct Checksums {
  std::vector<std::uint32_t> share;  // of this rank's share of every item
  std::vector<std::uint32_t> whole;  // of every whole dataset, the same on every rank
  // Where each dataset's bytes lie in the file with their CRC-32 (whole): the checksum sidecar is
  // computed from these and the file's other bytes (its HDF5 metadata), without reading the data back.
  std::vector<KnownRange> placed;
};

// Phase 3. Collective create of `tmp`; root attributes, groups and datasets (collective metadata);
// each rank's share of the data; the combined crc32 attribute of every dataset (one allreduce_sum);
// collective close. On return every rank's writes are complete in the file. Counts into `stats`.
Checksums write_temporary(const mpi::Comm& group, const std::string& tmp, const TrainState& s,
                          const std::vector<Item>& items, const CheckpointOptions& options,
                          CheckpointWriteStats& stats) {
  const int P = group.size(), me = group.rank();
  Checksums crc;
  crc.share.resize(items.size());
  using clock = std::chrono::steady_clock;
  auto lap = [](clock::time_point& t) {
    const auto now = clock::now();
    const double dt = std::chrono::duration<double>(now - t).count();
    t = now;
    return dt;
  };
  auto t = clock::now();
  h5::File f = h5::File::create(tmp, &group);
  h5::Transfer xfer(f, options.collective);
  h5::Transfer solo(f, false);  // small tensors: rank 0 alone, no synchronisation
  {
    h5::Group root = f.root();
    root.set_attr("fastudy_format", std::string(kCheckpointFormat));
    root.set_attr("step", s.step);
    root.set_attr("data_cursor", s.data_cursor);
    root.set_attr("good_steps", s.good_steps);
    root.set_attr("loss_scale", s.loss_scale);
    for (const auto& [k, v] : s.attrs) root.set_attr(k, v);

    std::vector<h5::Group> sections;
    for (const char* name : kSections) sections.push_back(root.create_group(name));
    std::vector<h5::Dataset> datasets;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const NamedArray& a = *items[i].array;
      h5::Group& where = items[i].section.empty()
                             ? root
                             : sections[static_cast<std::size_t>(
                                   std::find(std::begin(kSections), std::end(kSections), items[i].section) -
                                   std::begin(kSections))];
      lap(t);
      h5::Dataset d = where.create_dataset(a.name, a.dtype, a.shape);
      stats.create_seconds += lap(t);
      Share sh = share_of(a, me, P, options.split_bytes);
      if (a.data.empty()) {
        // An empty dataset has no storage to transfer to (the same on every rank).
      } else if (a.data.size() >= options.split_bytes) {
        d.write_rows(sh.bytes ? a.data.data() + sh.byte0 : nullptr, sh.row0, sh.rows, xfer);
        ++stats.transfers;
        if (xfer.io_mode() != "none") ++stats.collective_transfers;
      } else if (me == 0) {
        d.write_rows(a.data.data(), 0, sh.rows, solo);
        ++stats.transfers;
      }
      stats.transfer_seconds += lap(t);
      crc.share[i] = crc_of(a.data.data() + sh.byte0, sh.bytes);
      stats.checksum_seconds += lap(t);
      stats.bytes += static_cast<std::int64_t>(a.data.size());
      ++stats.datasets;
      datasets.push_back(std::move(d));
    }
    lap(t);
    crc.whole = combine_crcs(group, items, crc.share, options.split_bytes);
    stats.checksum_seconds += lap(t);
    for (std::size_t i = 0; i < items.size(); ++i) {
      datasets[i].set_attr(kCrcAttr, static_cast<std::int64_t>(crc.whole[i]));
      // A contiguous dataset holds the array's bytes verbatim at its offset: the file type is the
      // little-endian type of the array's raw bytes (h5.cpp file_type), so on a little-endian host the
      // stored bytes are a.data. A dataset without a contiguous block is read back like metadata.
      const std::int64_t at = datasets[i].file_offset();
      if (at >= 0 && kLittleEndianHost) {
        crc.placed.push_back(KnownRange{static_cast<std::uint64_t>(at), items[i].array->data.size(), crc.whole[i]});
      }
    }
  }
  f.close();
  stats.close_seconds += lap(t);
  return crc;
}

// Phase 4. Every rank re-reads its own share of `tmp` (independent reads) and checks it against its
// share checksum, and every stored crc32 attribute against the combined one; one allreduce_max.
// Returns on every rank when all shares check out; otherwise rank 0 removes `tmp` and every rank
// throws the same CheckpointError naming the first bad dataset.
void verify_temporary(const mpi::Comm& group, const std::string& tmp, const std::vector<Item>& items,
                      const Checksums& crc, std::size_t split_bytes) {
  const int P = group.size(), me = group.rank();
  std::int64_t bad = -1;  // index of the first item whose share does not read back
  {
    h5::File f = h5::File::open(tmp, false, &group);
    h5::Transfer xfer(f, false);  // each rank re-reads only its own share: nothing to coordinate
    h5::Group root = f.root();
    std::vector<std::byte> buf;
    for (std::size_t i = 0; i < items.size(); ++i) {  // every rank joins every collective read
      const NamedArray& a = *items[i].array;
      h5::Dataset d = items[i].section.empty() ? root.open_dataset(a.name)
                                               : root.open_group(items[i].section).open_dataset(a.name);
      Share sh = share_of(a, me, P, split_bytes);
      buf.resize(sh.bytes);
      if (sh.bytes > 0) d.read_rows(buf.data(), sh.row0, sh.rows, xfer);
      const bool stored_ok = static_cast<std::uint32_t>(d.attr_int64(kCrcAttr)) == crc.whole[i];
      const bool share_ok = crc_of(buf.data(), sh.bytes) == crc.share[i];
      if ((!stored_ok || !share_ok) && bad < 0) bad = static_cast<std::int64_t>(i);
    }
    if (root.attr_string("fastudy_format") != kCheckpointFormat) bad = 0;
  }
  bad = group.allreduce_max(bad);
  if (bad >= 0) {
    if (group.is_root()) {
      std::error_code ec;
      fs::remove(tmp, ec);
    }
    throw CheckpointError(tmp, dataset_label(items[static_cast<std::size_t>(bad)]),
                          "data read back after the write differs from what was written",
                          "the file system lost or changed data; check the disk and free space, then rerun");
  }
}

// Phase 5. Rank 0 sums `tmp` for its checksum sidecar "<path>.crc", writes the sidecar and renames
// `tmp` over `path` (commit_sealed: with `durable`, the file is fsync'ed before and its directory
// after the rename; on failure `tmp` is removed); one bcast. Returns with the checkpoint in place on
// every rank, or every rank throws a CheckpointError. The sum reads only the bytes outside the
// datasets' blocks (`placed`: HDF5's metadata, a few KiB) and splices in the datasets' CRC-32s
// (file_sum_known), so it is the file's CRC-32 exactly when every block holds the bytes fastudy meant
// to write — which the verification checks (options.verify). Without it, a block the file system got
// wrong makes the sidecar disagree with the file, and the checkpoint reads as damaged (fastudy falls
// back to an older one): the sidecar never seals bytes that differ from the state. Rank 0's seconds of
// summing go to *sum_seconds.
void commit_temporary(const mpi::Comm& group, const std::string& tmp, const std::string& path, bool durable,
                      const std::vector<KnownRange>& placed, double* sum_seconds) {
  // No barrier needed: closing (MPI_File_close) is collective and completes every rank's writes, and
  // the verification ended with a reduction.
  std::string failure;
  if (group.is_root()) {
    try {
      const auto t = std::chrono::steady_clock::now();
      const FileSum sum = file_sum_known(tmp, placed);
      *sum_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      commit_sealed(tmp, path, sum, durable);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  group.bcast(failure);
  if (!failure.empty()) {
    throw CheckpointError(path, "", "could not move the verified file into place: " + failure,
                          "check permissions and free space of the output directory");
  }
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

CheckpointWriteStats write_checkpoint(const mpi::Comm& group, const std::string& path, const TrainState& s,
                                      const CheckpointOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const NamedArray history = loss_history_array(s.loss_history);
  const std::vector<Item> items = items_of(s, history);
  agree_on_state(group, path, s, items);
  const std::string tmp = prepare_temporary(group, path);

  CheckpointWriteStats stats;
  auto phase = std::chrono::steady_clock::now();
  const Checksums crc = write_temporary(group, tmp, s, items, options, stats);
  stats.write_seconds = seconds_since(phase);

  phase = std::chrono::steady_clock::now();
  if (options.verify) verify_temporary(group, tmp, items, crc, options.split_bytes);
  stats.verify_seconds = seconds_since(phase);

  phase = std::chrono::steady_clock::now();
  commit_temporary(group, tmp, path, options.fsync, crc.placed, &stats.sum_seconds);
  stats.commit_seconds = seconds_since(phase);
  stats.seconds = seconds_since(t0);
  return stats;
}

}  // namespace fastudy
