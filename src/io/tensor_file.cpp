// TensorFile: the safetensors reader (one file or a sharded index), the HDF5 (h5py) reader, and the
// registry of readers for other extensions. safetensors' layout (huggingface/safetensors, README
// "Format"): u64 little-endian N; N bytes of UTF-8 JSON, an object whose keys are tensor names (and
// the optional "__metadata__": string to string), each {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]} with offsets relative to the byte buffer after the header.
#include "src/io/tensor_file.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/mapped_file.hpp"
#include "src/io/h5.hpp"

namespace fastudy::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE binary32/binary64 expected");

// safetensors' own limit on the header (safetensors/src/tensor.rs: MAX_HEADER_SIZE, 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

[[noreturn]] void bad(const std::string& file, const std::string& what, const std::string& hint = {}) {
  throw UsageError("'" + file + "': " + what, hint);
}

std::optional<Format> safetensors_format(const std::string& dtype) {
  if (dtype == "F64") return Format::fp64;
  if (dtype == "F32") return Format::fp32;
  if (dtype == "F16") return Format::fp16;
  if (dtype == "BF16") return Format::bf16;
  return std::nullopt;
}

// Element sizes of every dtype safetensors defines (safetensors/src/tensor.rs: Dtype::size), so the
// byte ranges of tensors fastudy does not read are checked too.
std::optional<std::size_t> safetensors_element_bytes(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

// Converts n stored elements of format f at `src` (any alignment) into out.
template <class T>
void convert(Format f, const std::byte* src, std::uint64_t n, T* out) {
  switch (f) {
    case Format::fp64:
      for (std::uint64_t i = 0; i < n; ++i) {
        double x;
        std::memcpy(&x, src + 8 * i, 8);
        out[i] = static_cast<T>(x);
      }
      return;
    case Format::fp32:
      for (std::uint64_t i = 0; i < n; ++i) {
        float x;
        std::memcpy(&x, src + 4 * i, 4);
        out[i] = static_cast<T>(x);
      }
      return;
    case Format::fp16:
    case Format::bf16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        out[i] = static_cast<T>(f == Format::fp16 ? from_fp16_bits(b) : from_bf16_bits(b));
      }
      return;
    default: break;
  }
  throw Error("tensor_file: no conversion from " + std::string(to_string(f)));
}

// ---- safetensors ------------------------------------------------------------------------------------

struct SafetensorsFile {
  MappedFile map;
  std::uint64_t buffer_offset = 0;  // 8 + header length
  struct Range {
    std::uint64_t begin, end;
  };
  std::map<std::string, Range> ranges;  // tensor name -> byte range in the buffer
  std::vector<TensorEntry> entries;     // in buffer order
};

std::uint64_t checked_elements(const std::string& file, const std::string& name, const json& shape,
                               std::vector<std::int64_t>& dims) {
  if (!shape.is_array()) bad(file, "tensor '" + name + "': \"shape\" is not an array of integers");
  std::uint64_t n = 1;
  for (const auto& d : shape) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
      bad(file, "tensor '" + name + "': \"shape\" holds " + d.dump() + ", not a non-negative integer");
    const auto v = d.get<std::uint64_t>();
    if (v != 0 && n > (std::uint64_t(1) << 62) / v) bad(file, "tensor '" + name + "': shape " + shape.dump() + " is too large");
    n *= v;
    dims.push_back(static_cast<std::int64_t>(v));
  }
  return n;
}

SafetensorsFile open_safetensors(const std::string& path) {
  SafetensorsFile f{MappedFile(path), 0, {}, {}};
  const std::uint64_t size = f.map.size();
  const std::string hint = "the file is not a complete safetensors file (written by safetensors' save_file or "
                           "save_model); write it again";
  if (size < 8) bad(path, "too short for a safetensors header (" + std::to_string(size) + " bytes)", hint);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<std::uint8_t>(f.map.data()[i]);
  if (header_len > kMaxHeaderBytes)
    bad(path, "the header length " + std::to_string(header_len) + " is above safetensors' limit of 100 MB", hint);
  if (header_len > size - 8)
    bad(path, "truncated: the header claims " + std::to_string(header_len) + " bytes but the file has " +
                  std::to_string(size - 8) + " after the length field",
        hint);
  f.buffer_offset = 8 + header_len;
  const std::uint64_t buffer_size = size - f.buffer_offset;
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(f.map.data()) + 8,
                         reinterpret_cast<const char*>(f.map.data()) + 8 + header_len);
  } catch (const json::parse_error& e) {
    bad(path, std::string("the safetensors header is not valid JSON: ") + e.what(), hint);
  }
  if (!header.is_object()) bad(path, "the safetensors header is not a JSON object", hint);
  std::vector<std::pair<std::uint64_t, std::string>> order;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets") ||
        !info["dtype"].is_string())
      bad(path, "tensor '" + name + "': the header entry lacks \"dtype\", \"shape\" or \"data_offsets\"", hint);
    TensorEntry e;
    e.name = name;
    e.file = path;
    e.stored_type = info["dtype"].get<std::string>();
    e.format = safetensors_format(e.stored_type);
    const auto element_bytes = safetensors_element_bytes(e.stored_type);
    if (!element_bytes) bad(path, "tensor '" + name + "': unknown dtype \"" + e.stored_type + "\"", hint);
    e.elements = checked_elements(path, name, info["shape"], e.shape);
    const json& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(path, "tensor '" + name + "': \"data_offsets\" is not [begin, end]", hint);
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end || end > buffer_size)
      bad(path, "tensor '" + name + "': data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                    "] point outside the " + std::to_string(buffer_size) + "-byte data buffer (truncated or damaged file)",
          hint);
    if (end - begin != e.elements * *element_bytes)
      bad(path, "tensor '" + name + "': data_offsets span " + std::to_string(end - begin) + " bytes but " +
                    e.stored_type + " of shape " + info["shape"].dump() + " needs " +
                    std::to_string(e.elements * *element_bytes),
          hint);
    f.ranges[name] = {begin, end};
    order.emplace_back(begin, name);
    f.entries.push_back(std::move(e));
  }
  std::sort(order.begin(), order.end());
  std::uint64_t reached = 0;  // the largest end of the ranges before this one
  std::string reached_by;
  for (const auto& [begin, name] : order) {
    const auto end = f.ranges[name].end;
    if (end == begin) continue;  // an empty tensor occupies no bytes
    if (begin < reached) bad(path, "tensors '" + reached_by + "' and '" + name + "' overlap in the data buffer", hint);
    reached = end;
    reached_by = name;
  }
  std::map<std::string, std::size_t> rank;
  for (std::size_t i = 0; i < order.size(); ++i) rank[order[i].second] = i;
  std::sort(f.entries.begin(), f.entries.end(),
            [&](const TensorEntry& a, const TensorEntry& b) { return rank[a.name] < rank[b.name]; });
  return f;
}

class SafetensorsSource : public TensorSource {
 public:
  // One file, or the shards of an index (`index` the index's path, "" for one file).
  SafetensorsSource(std::vector<SafetensorsFile> shards, std::string index)
      : shards_(std::move(shards)), index_(std::move(index)) {
    for (std::size_t s = 0; s < shards_.size(); ++s)
      for (const auto& e : shards_[s].entries) {
        where_[e.name] = s;
        entries_.push_back(e);
      }
  }
  const std::vector<TensorEntry>& tensors() const override { return entries_; }
  std::vector<std::string> files() const override {
    std::vector<std::string> out;
    if (!index_.empty()) out.push_back(index_);
    for (const auto& s : shards_) out.push_back(s.map.path());
    return out;
  }
  bool in_place() const override { return true; }
  void read(const TensorEntry& t, double* out) const override { read_as(t, 0, t.elements, out); }
  void read(const TensorEntry& t, float* out) const override { read_as(t, 0, t.elements, out); }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const override {
    read_as(t, begin, count, out);
  }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const override {
    read_as(t, begin, count, out);
  }

 private:
  template <class T>
  void read_as(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) const {
    const SafetensorsFile& f = shards_.at(where_.at(t.name));
    const auto& r = f.ranges.at(t.name);
    convert(*t.format, f.map.data() + f.buffer_offset + r.begin + begin * stored_element_bytes(*t.format), count, out);
  }
  std::vector<SafetensorsFile> shards_;
  std::string index_;
  std::map<std::string, std::size_t> where_;
  std::vector<TensorEntry> entries_;
};

std::string read_text(const std::string& path) {
  MappedFile m(path);
  return std::string(reinterpret_cast<const char*>(m.data()), m.size());
}

// A sharded checkpoint: {"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00002.safetensors"}}.
std::unique_ptr<TensorSource> open_safetensors_index(const std::string& path) {
  const std::string hint = "a sharded checkpoint's index is written by save_pretrained / huggingface_hub's "
                           "save_torch_state_dict next to its shards";
  json index;
  try {
    index = json::parse(read_text(path));
  } catch (const json::parse_error& e) {
    bad(path, std::string("not valid JSON: ") + e.what(), hint);
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    bad(path, "no \"weight_map\" object (tensor name -> shard file)", hint);
  std::map<std::string, std::string> shard_of;
  std::vector<std::string> shard_names;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) bad(path, "weight_map[\"" + name + "\"] is not a file name", hint);
    const std::string s = shard.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == ".." || !ends_with(s, ".safetensors"))
      bad(path, "weight_map[\"" + name + "\"] = \"" + s + "\" is not the name of a .safetensors file beside the index",
          "shards must lie in the index's own directory");
    shard_of[name] = s;
    if (std::find(shard_names.begin(), shard_names.end(), s) == shard_names.end()) shard_names.push_back(s);
  }
  if (shard_of.empty()) bad(path, "the weight_map names no tensor", hint);
  const fs::path dir = fs::path(path).parent_path();
  std::vector<SafetensorsFile> shards;
  for (const auto& s : shard_names) {
    SafetensorsFile f = open_safetensors((dir / s).string());
    for (const auto& e : f.entries) {
      auto it = shard_of.find(e.name);
      if (it == shard_of.end())
        bad(f.map.path(), "tensor '" + e.name + "' is not in the weight_map of '" + path + "'", hint);
      if (it->second != s)
        bad(f.map.path(), "tensor '" + e.name + "' is also in this shard, but the index '" + path + "' maps it to '" +
                              it->second + "'",
            hint);
    }
    shards.push_back(std::move(f));
  }
  for (const auto& [name, s] : shard_of) {
    const auto& f = shards[static_cast<std::size_t>(std::find(shard_names.begin(), shard_names.end(), s) - shard_names.begin())];
    if (f.ranges.count(name) == 0)
      bad(f.map.path(), "tensor '" + name + "' is missing: the index '" + path + "' says this shard holds it", hint);
  }
  return std::make_unique<SafetensorsSource>(std::move(shards), path);
}

// ---- HDF5 (h5py) ------------------------------------------------------------------------------------

std::optional<Format> hdf5_format(const h5::StoredType& t) {
  if (t.cls != h5::StoredType::Class::floating) return std::nullopt;
  if (t.bytes == 8 && t.exponent_bits == 11 && t.mantissa_bits == 52) return Format::fp64;
  if (t.bytes == 4 && t.exponent_bits == 8 && t.mantissa_bits == 23) return Format::fp32;
  if (t.bytes == 2 && t.exponent_bits == 5 && t.mantissa_bits == 10) return Format::fp16;
  if (t.bytes == 2 && t.exponent_bits == 8 && t.mantissa_bits == 7) return Format::bf16;
  return std::nullopt;
}

std::string hdf5_type_word(const h5::StoredType& t) {
  const std::string bits = std::to_string(8 * t.bytes);
  if (t.cls == h5::StoredType::Class::integer) return "int" + bits;
  if (t.cls == h5::StoredType::Class::floating) {
    if (auto f = hdf5_format(t)) return f == Format::bf16 ? "bfloat16" : "float" + bits;
    return "float" + bits + " (exponent " + std::to_string(t.exponent_bits) + ", mantissa " +
           std::to_string(t.mantissa_bits) + " bits)";
  }
  return "non-numeric (" + bits + " bits)";
}

class Hdf5Source : public TensorSource {
 public:
  explicit Hdf5Source(const std::string& path) : file_(open_file(path)) { walk(file_.root(), ""); }
  const std::vector<TensorEntry>& tensors() const override { return entries_; }
  std::vector<std::string> files() const override { return {file_.path()}; }
  void read(const TensorEntry& t, double* out) const override { dataset(t).read_all_converted(out); }
  void read(const TensorEntry& t, float* out) const override { dataset(t).read_all_converted(out); }

 private:
  static h5::File open_file(const std::string& path) {
    if (!fs::is_regular_file(path)) bad(path, "no such file (or not a regular file)");
    if (!h5::File::is_hdf5(path)) bad(path, "not an HDF5 file (no HDF5 signature): truncated, damaged or another format");
    try {
      return h5::File::open(path, false, nullptr);
    } catch (const h5::H5Error& e) {
      bad(path, std::string("HDF5 cannot open it: ") + e.what());
    }
  }
  void walk(const h5::Group& g, const std::string& prefix) {
    for (const auto& child : g.children()) {
      const std::string name = prefix + child;
      switch (g.child_kind(child)) {
        case h5::Group::Kind::group: walk(g.open_group(child), name + "."); break;
        case h5::Group::Kind::dataset: {
          const h5::Dataset d = g.open_dataset(child);
          TensorEntry e;
          e.name = name;
          e.file = file_.path();
          const h5::StoredType t = d.stored_type();
          e.format = hdf5_format(t);
          e.stored_type = hdf5_type_word(t);
          e.shape = d.shape();
          e.elements = 1;
          for (auto x : e.shape) e.elements *= static_cast<std::uint64_t>(x);
          paths_[name] = d.where().object;
          entries_.push_back(std::move(e));
          break;
        }
        case h5::Group::Kind::other: break;
      }
    }
  }
  h5::Dataset dataset(const TensorEntry& t) const {
    const std::string& object = paths_.at(t.name);
    return file_.root().open_dataset(object.substr(1));  // object paths start with '/'
  }
  h5::File file_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> paths_;
};

// ---- the registry -----------------------------------------------------------------------------------

struct Registry {
  std::mutex mutex;
  std::map<std::string, TensorSourceOpener> openers;
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::size_t stored_element_bytes(Format f) {
  switch (f) {
    case Format::fp64: return 8;
    case Format::fp32: return 4;
    case Format::fp16:
    case Format::bf16: return 2;
    default: return 1;
  }
}

void register_tensor_format(const std::string& extension, TensorSourceOpener opener) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.openers[extension] = std::move(opener);
}

TensorFile TensorFile::open(const std::string& path) {
  if (ends_with(path, ".safetensors.index.json")) return TensorFile(path, open_safetensors_index(path));
  if (ends_with(path, ".safetensors")) {
    std::vector<SafetensorsFile> one;
    one.push_back(open_safetensors(path));
    return TensorFile(path, std::make_unique<SafetensorsSource>(std::move(one), ""));
  }
  if (ends_with(path, ".h5") || ends_with(path, ".hdf5")) return TensorFile(path, std::make_unique<Hdf5Source>(path));
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [extension, opener] : r.openers)
      if (ends_with(path, extension)) return TensorFile(path, opener(path));
  }
  if (ends_with(path, ".pt") || ends_with(path, ".pth") || ends_with(path, ".bin"))
    bad(path, "torch.save files are read through LibTorch, which this program does not link",
        "run the full `fastudy` program (fastudy-main), or save the tensors as safetensors");
  bad(path, "unknown tensor file type (by its name)",
      "use .safetensors, .safetensors.index.json, .h5/.hdf5 (h5py) or a torch.save file (.pt, .pth, .bin)");
}

const TensorEntry* TensorFile::find(std::string_view name) const {
  for (const auto& t : tensors())
    if (t.name == name) return &t;
  return nullptr;
}

std::uint64_t TensorFile::data_bytes() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors()) {
    if (t.format) {
      n += t.elements * stored_element_bytes(*t.format);
    } else if (auto b = safetensors_element_bytes(t.stored_type)) {
      n += t.elements * *b;
    }
  }
  return n;
}

namespace {

template <class T>
void read_range_whole(const TensorSource& source, const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) {
  std::vector<T> all(t.elements);
  source.read(t, all.data());
  std::copy(all.begin() + static_cast<std::ptrdiff_t>(begin), all.begin() + static_cast<std::ptrdiff_t>(begin + count), out);
}

template <class T>
void checked_range(const TensorSource& source, const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) {
  if (!t.format)
    bad(t.file, "tensor '" + t.name + "' holds " + t.stored_type + " values; fastudy reads F64, F32, F16 and BF16");
  if (begin > t.elements || count > t.elements - begin)
    throw Error("tensor_file: elements [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ") of tensor '" +
                t.name + "' in '" + t.file + "', which has " + std::to_string(t.elements));
  source.read_range(t, begin, count, out);
}

}  // namespace

void TensorSource::read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const {
  read_range_whole(*this, t, begin, count, out);
}
void TensorSource::read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const {
  read_range_whole(*this, t, begin, count, out);
}

void TensorFile::read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const {
  checked_range(*source_, t, begin, count, out);
}
void TensorFile::read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const {
  checked_range(*source_, t, begin, count, out);
}

void TensorFile::read(const TensorEntry& t, double* out) const {
  if (!t.format)
    bad(t.file, "tensor '" + t.name + "' holds " + t.stored_type + " values; fastudy reads F64, F32, F16 and BF16");
  source_->read(t, out);
}

void TensorFile::read(const TensorEntry& t, float* out) const {
  if (!t.format)
    bad(t.file, "tensor '" + t.name + "' holds " + t.stored_type + " values; fastudy reads F64, F32, F16 and BF16");
  source_->read(t, out);
}

}  // namespace fastudy::io
