// The checkpoint readers (whole state, parameters only, root attributes, the collective read) and the
// check of a file (checkpoint_problem); see checkpoint.hpp for the file layout. Every read checks the
// whole file against its checksum sidecar before HDF5 opens it (unless the caller checked it earlier
// in the same run) and every dataset against its crc32 attribute.
#include "src/io/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <type_traits>

#include "base/bytes.hpp"
#include "base/checksum.hpp"
#include "base/read_file.hpp"
#include "src/io/checkpoint_format.hpp"
#include "src/io/h5.hpp"

namespace fastudy {
namespace fs = std::filesystem;

CheckpointError::CheckpointError(std::string file, std::string dataset, const std::string& problem,
                                 std::string hint)
    : Error("checkpoint '" + file + "'" + (dataset.empty() ? "" : ", dataset '" + dataset + "'") + ": " + problem,
            std::move(hint)),
      file_(std::move(file)),
      dataset_(std::move(dataset)) {}

namespace {

using checkpoint_format::crc_of;
using checkpoint_format::kCrcAttr;
using checkpoint_format::kLossHistory;

const char* kHintCorrupt =
    "the file was damaged after it was written; delete it and resume: fastudy picks the newest valid "
    "checkpoint of the variant";

std::string hex32(std::uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return s.str();
}

h5::File open_checked(const std::string& path, WholeFile whole = WholeFile::verify) {
  if (!fs::exists(path)) {
    throw CheckpointError(path, "", "no such file",
                          "check the path; checkpoints live in OUT/checkpoints/<variant>/step_NNNNNNN.h5");
  }
  // Verify before you parse: HDF5 never sees a byte that differs from what fastudy wrote (a damaged
  // file can crash or hang libhdf5, and root attributes such as data_cursor carry no crc32 of their own).
  if (whole == WholeFile::verify) {
    try {
      verify_sealed(path, kHintCorrupt);
    } catch (const IntegrityError& e) {
      throw CheckpointError(path, "", e.problem(), kHintCorrupt);
    }
  }
  if (!h5::File::is_hdf5(path)) {
    throw CheckpointError(path, "", "not an HDF5 file (empty, truncated at the start or overwritten)",
                          kHintCorrupt);
  }
  try {
    h5::File f = h5::File::open(path, false, nullptr);
    h5::Group root = f.root();
    if (!root.has_attr("fastudy_format")) {
      throw CheckpointError(path, "", "an HDF5 file without the fastudy_format attribute: not a fastudy checkpoint",
                            "pass a file written by fastudy");
    }
    const std::string format = root.attr_string("fastudy_format");
    if (format != kCheckpointFormat) {
      throw CheckpointError(path, "", "format '" + format + "' is not the supported '" + kCheckpointFormat + "'",
                            "read it with the fastudy version that wrote it, or rerun the training");
    }
    return f;
  } catch (const h5::H5Error& e) {
    const bool truncated = e.details().find("truncated") != std::string::npos;
    throw CheckpointError(path, "", (truncated ? "truncated file (HDF5: " : "cannot be opened (HDF5: ") + e.details() + ")",
                          kHintCorrupt);
  }
}

NamedArray read_array(const h5::Group& g, const std::string& name, const std::string& label,
                      const std::string& path) {
  try {
    h5::Dataset d = g.open_dataset(name);
    NamedArray a;
    a.name = name;
    a.shape = d.shape();
    a.dtype = d.dtype();
    a.data.resize(static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype));
    if (!a.data.empty()) d.read_all(a.data.data());
    if (!d.has_attr(kCrcAttr)) {
      throw CheckpointError(path, label, "no crc32 attribute", "the file was not written by fastudy_io");
    }
    const auto stored = static_cast<std::uint32_t>(d.attr_int64(kCrcAttr));
    const std::uint32_t actual = crc_of(a.data.data(), a.data.size());
    if (stored != actual) {
      throw CheckpointError(path, label,
                            "checksum mismatch (stored crc32 " + hex32(stored) + ", data has " + hex32(actual) + ")",
                            kHintCorrupt);
    }
    return a;
  } catch (const h5::H5Error& e) {
    throw CheckpointError(path, label, "cannot be read (" + e.details() + ")", kHintCorrupt);
  }
}

std::vector<NamedArray> read_section(const h5::Group& root, const std::string& section, const std::string& path,
                                     const std::vector<std::string>& only = {}) {
  std::vector<NamedArray> out;
  try {
    if (!root.has(section)) {
      throw CheckpointError(path, "/" + section, "group missing", kHintCorrupt);
    }
    h5::Group g = root.open_group(section);
    const std::vector<std::string> names = g.children();
    if (only.empty()) {
      for (const auto& n : names) out.push_back(read_array(g, n, "/" + section + "/" + n, path));
    } else {
      for (const auto& n : only) {
        if (std::find(names.begin(), names.end(), n) == names.end()) {
          throw CheckpointError(path, "/" + section + "/" + n,
                                "no such dataset (the file has " + std::to_string(names.size()) + " in /" + section +
                                    ")",
                                "list them with: h5dump -H " + path);
        }
        out.push_back(read_array(g, n, "/" + section + "/" + n, path));
      }
    }
  } catch (const h5::H5Error& e) {
    throw CheckpointError(path, "/" + section, "cannot be listed (" + e.details() + ")", kHintCorrupt);
  }
  return out;
}

// A TrainState as bytes (base/bytes.hpp), for the broadcast of the collective read: the scalars, the
// three sections of arrays (each: count, then per array its name, dtype, shape and bytes), the loss
// history and the attributes.
void put_arrays(ByteWriter& w, const std::vector<NamedArray>& arrays) {
  w.put<std::uint64_t>(arrays.size());
  for (const auto& a : arrays) {
    w.put_string(a.name);
    w.put(static_cast<std::uint8_t>(a.dtype));
    w.put<std::uint64_t>(a.shape.size());
    for (auto d : a.shape) w.put(d);
    w.put<std::uint64_t>(a.data.size());
    w.put_bytes(a.data.data(), a.data.size());
  }
}

std::vector<NamedArray> get_arrays(ByteReader& r) {
  std::vector<NamedArray> arrays(r.get<std::uint64_t>());
  for (auto& a : arrays) {
    a.name = r.get_string();
    a.dtype = static_cast<DType>(r.get<std::uint8_t>());
    a.shape.resize(r.get<std::uint64_t>());
    for (auto& d : a.shape) d = r.get<std::int64_t>();
    a.data.resize(r.get<std::uint64_t>());
    r.get_bytes(a.data.data(), a.data.size());
  }
  return arrays;
}

std::string encode(const TrainState& s) {
  ByteWriter w;
  w.put(s.step);
  w.put(s.data_cursor);
  w.put(s.loss_scale);
  w.put(s.good_steps);
  put_arrays(w, s.params);
  put_arrays(w, s.optimizer);
  put_arrays(w, s.extra);
  w.put<std::uint64_t>(s.loss_history.size());
  w.put_bytes(s.loss_history.data(), s.loss_history.size() * sizeof(double));
  w.put<std::uint64_t>(s.attrs.size());
  for (const auto& [k, v] : s.attrs) {
    w.put_string(k);
    w.put_string(v);
  }
  return w.take();
}

TrainState decode(const std::string& bytes, const std::string& path) {
  ByteReader r(bytes, "checkpoint '" + path + "': the state broadcast by rank 0");
  TrainState s;
  s.step = r.get<std::int64_t>();
  s.data_cursor = r.get<std::int64_t>();
  s.loss_scale = r.get<double>();
  s.good_steps = r.get<std::int64_t>();
  s.params = get_arrays(r);
  s.optimizer = get_arrays(r);
  s.extra = get_arrays(r);
  s.loss_history.resize(r.get<std::uint64_t>());
  r.get_bytes(s.loss_history.data(), s.loss_history.size() * sizeof(double));
  const auto n = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string k = r.get_string();
    s.attrs[k] = r.get_string();
  }
  return s;
}

void read_root_attrs(const h5::Group& root, const std::string& path, TrainState& s) {
  try {
    s.step = root.attr_int64("step");
    s.data_cursor = root.attr_int64("data_cursor");
    s.good_steps = root.attr_int64("good_steps");
    s.loss_scale = root.attr_double("loss_scale");
    for (const auto& name : root.string_attr_names()) {
      if (name != "fastudy_format") s.attrs[name] = root.attr_string(name);
    }
  } catch (const h5::H5Error& e) {
    throw CheckpointError(path, "/", "root attributes cannot be read (" + e.details() + ")", kHintCorrupt);
  }
}
}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path, WholeFile whole) {
  h5::File f = open_checked(path, whole);
  TrainState s;
  read_root_attrs(f.root(), path, s);
  return CheckpointInfo{s.step, s.data_cursor, std::move(s.attrs)};
}

TrainState read_checkpoint(const std::string& path) {
  h5::File f = open_checked(path);
  TrainState s;
  {
    h5::Group root = f.root();
    read_root_attrs(root, path, s);
    s.params = read_section(root, "params", path);
    s.optimizer = read_section(root, "optimizer", path);
    s.extra = read_section(root, "extra", path);
    NamedArray h = read_array(root, kLossHistory, std::string("/") + kLossHistory, path);
    if (h.dtype != DType::f64 || h.shape.size() != 1) {
      throw CheckpointError(path, std::string("/") + kLossHistory, "expected a 1-D float64 dataset", kHintCorrupt);
    }
    s.loss_history.resize(static_cast<std::size_t>(h.numel()));
    if (!h.data.empty()) std::memcpy(s.loss_history.data(), h.data.data(), h.data.size());
  }
  return s;
}

TrainState read_checkpoint(const mpi::Comm& group, const std::string& path) {
  std::string bytes, error, dataset, hint;
  if (group.is_root()) {
    try {
      bytes = encode(read_checkpoint(path));
    } catch (const CheckpointError& e) {
      error = e.what();
      dataset = e.dataset();
      hint = e.hint();
    }
  }
  group.bcast(error);
  if (!error.empty()) {
    group.bcast(dataset);
    group.bcast(hint);
    // The message already names the file and dataset; rebuild the same error on every rank.
    const std::string prefix = "checkpoint '" + path + "'" + (dataset.empty() ? "" : ", dataset '" + dataset + "'") + ": ";
    throw CheckpointError(path, dataset, error.substr(error.rfind(prefix, 0) == 0 ? prefix.size() : 0), hint);
  }
  group.bcast(bytes);
  return decode(bytes, path);
}

std::vector<NamedArray> read_params(const std::string& path, const std::vector<std::string>& names, WholeFile whole) {
  h5::File f = open_checked(path, whole);
  h5::Group root = f.root();
  return read_section(root, "params", path, names);
}

struct CheckpointParams::Mapping {
  RegularFile file;
};

CheckpointParams::CheckpointParams(const std::string& path) : path_(path) {
  {
    h5::File f = open_checked(path, WholeFile::checked_before);
    try {
      h5::Group g = f.root().open_group("params");
      for (const auto& name : g.children()) {
        h5::Dataset d = g.open_dataset(name);
        Param p;
        p.dtype = d.dtype();
        p.numel = static_cast<std::uint64_t>(d.numel());
        const std::int64_t at = d.file_offset();
        if (p.dtype != DType::f32 && p.dtype != DType::f64)
          throw CheckpointError(path, "/params/" + name, "a parameter of type " + std::string(to_string(p.dtype)) +
                                "; the reducer reads f32 and f64", kHintCorrupt);
        if (at < 0 && p.numel > 0)
          throw CheckpointError(path, "/params/" + name, "not stored contiguously (fastudy writes every parameter so)",
                                kHintCorrupt);
        p.offset = static_cast<std::uint64_t>(std::max<std::int64_t>(at, 0));
        params_.emplace(name, p);
      }
    } catch (const h5::H5Error& e) {
      throw CheckpointError(path, "/params", "cannot be listed (" + e.details() + ")", kHintCorrupt);
    }
  }
  std::string problem;
  std::optional<RegularFile> file = RegularFile::open(path, &problem);
  if (!file) throw CheckpointError(path, "", problem, kHintCorrupt);
  map_ = std::make_unique<Mapping>(Mapping{std::move(*file)});
  for (const auto& [name, p] : params_)
    if (p.offset + p.numel * dtype_size(p.dtype) > map_->file.size())
      throw CheckpointError(path, "/params/" + name, "its data lies beyond the end of the file", kHintCorrupt);
}

CheckpointParams::~CheckpointParams() = default;

template <class T>
void CheckpointParams::read_as(const std::string& name, std::uint64_t begin, std::uint64_t count, T* out) const {
  const auto it = params_.find(name);
  if (it == params_.end())
    throw CheckpointError(path_, "/params/" + name, "no such parameter", "list them with: h5dump -H " + path_);
  const Param& p = it->second;
  if (begin > p.numel || count > p.numel - begin)
    throw CheckpointError(path_, "/params/" + name, "values [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                          ") of " + std::to_string(p.numel), kHintCorrupt);
  // Positioned reads (a mapping would turn a file truncated meanwhile into SIGBUS): straight into `out`
  // where the stored type is T, else through a buffer of kChunk values, converted.
  const std::size_t width = dtype_size(p.dtype);
  const auto read_bytes = [&](void* buf, std::uint64_t first, std::uint64_t n) {
    const long long got = map_->file.read_at(buf, n * width, p.offset + first * width);
    if (got < 0)
      throw CheckpointError(path_, "/params/" + name, std::string("cannot be read: ") + std::strerror(errno), kHintCorrupt);
    if (static_cast<std::uint64_t>(got) != n * width)
      throw CheckpointError(path_, "/params/" + name, "the file changed while it was read (it is now shorter)",
                            "run again once nothing writes the checkpoints");
  };
  const bool same = (p.dtype == DType::f32 && std::is_same_v<T, float>) || (p.dtype == DType::f64 && std::is_same_v<T, double>);
  if (same) {
    read_bytes(out, begin, count);
    return;
  }
  constexpr std::uint64_t kChunk = 1 << 16;
  std::vector<std::byte> buf(std::min(count, kChunk) * width);
  for (std::uint64_t done = 0; done < count;) {
    const std::uint64_t n = std::min(count - done, kChunk);
    read_bytes(buf.data(), begin + done, n);
    for (std::uint64_t i = 0; i < n; ++i) {
      if (p.dtype == DType::f32) {
        float x;
        std::memcpy(&x, buf.data() + i * sizeof x, sizeof x);
        out[done + i] = static_cast<T>(x);
      } else {
        double x;
        std::memcpy(&x, buf.data() + i * sizeof x, sizeof x);
        out[done + i] = static_cast<T>(x);
      }
    }
    done += n;
  }
}

void CheckpointParams::read(const std::string& name, std::uint64_t begin, std::uint64_t count, float* out) const {
  read_as(name, begin, count, out);
}
void CheckpointParams::read(const std::string& name, std::uint64_t begin, std::uint64_t count, double* out) const {
  read_as(name, begin, count, out);
}

std::optional<std::string> identity_problem(const CheckpointInfo& info, const CheckpointIdentity& want) {
  const auto attr = [&](const char* name) {
    const auto it = info.attrs.find(name);
    return it == info.attrs.end() ? std::optional<std::string>() : it->second;
  };
  const std::optional<std::string> variant = attr("variant");
  if (variant != want.variant || info.step != want.step) {
    return "its attributes say it is " +
           (variant ? "variant '" + *variant + "'" : std::string("a checkpoint without a variant attribute")) +
           " at step " + std::to_string(info.step) + ", not variant '" + want.variant + "' at step " +
           std::to_string(want.step) + " as its place says: a checkpoint copied or moved here (whole, but not this one)";
  }
  const std::optional<std::string> hash = attr("config_hash");
  if (!want.config_hash.empty() && hash != want.config_hash) {
    return "it was trained with configuration hash " + hash.value_or("(none)") + ", but variant '" + want.variant +
           "' of the study (study.toml) has hash " + want.config_hash +
           ": study.toml changed after it was trained, or the checkpoint comes from another study";
  }
  return std::nullopt;
}

std::optional<std::string> checkpoint_problem(const std::string& path, const CheckpointIdentity* want) {
  try {
    TrainState s = read_checkpoint(path);
    if (!want) return std::nullopt;
    if (auto problem = identity_problem(CheckpointInfo{s.step, s.data_cursor, std::move(s.attrs)}, *want))
      return "checkpoint '" + path + "': " + *problem;
  } catch (const CheckpointError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

}  // namespace fastudy
