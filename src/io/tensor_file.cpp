// TensorFile: the safetensors reader (one file or a sharded index), the HDF5 (h5py) reader, and the
// registry of readers for other extensions. safetensors' layout (huggingface/safetensors, README
// "Format"): u64 little-endian N; N bytes of UTF-8 JSON, an object whose keys are tensor names (and
// the optional "__metadata__": string to string), each {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]} with offsets relative to the byte buffer after the header.
#include "src/io/tensor_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/quote.hpp"
#include "base/read_file.hpp"
#include "src/io/h5.hpp"
#include "src/io/hdf5_reader.hpp"

namespace fastudy::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE binary32/binary64 expected");

// safetensors' own limit on the header (safetensors/src/tensor.rs: MAX_HEADER_SIZE, 100 MB); an index
// is a JSON file of names, far smaller.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// JSON nesting a reader accepts: a safetensors header is 3 levels deep (the object, a tensor's entry,
// its shape), an index 3 (the object, weight_map or metadata, a value); 64 leaves room for any metadata
// and bounds the nesting a parse, a copy or a message has to walk.
constexpr int kMaxJsonDepth = 64;
// Dimensions of one tensor: more than any framework makes (PyTorch and HDF5 stop at 32 and 64).
constexpr std::size_t kMaxDims = 64;
// HDF5 groups nested below the root, and the largest ratio of a filtered (compressed) dataset's
// elements to its stored bytes: deflate's is 1032:1 (zlib's technical details), so a dataset that
// claims more is damaged or crafted, not compressed.
constexpr int kMaxGroupDepth = 64;
constexpr std::uint64_t kMaxExpansion = 1100;
// The piece of a tensor read from a file at a time (then converted into the caller's buffer).
constexpr std::size_t kReadPiece = std::size_t{1} << 20;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

[[noreturn]] void bad(const std::string& file, const std::string& what, const std::string& hint = {}) {
  throw UsageError("'" + file + "': " + what, hint);
}

std::string tensor_of(const std::string& name) { return "tensor " + quoted_name(name); }

// At most 100 characters of a JSON value, for a message.
std::string shown(const json& v) {
  const std::string s = v.dump();
  return s.size() <= 100 ? s : s.substr(0, 100) + "...";
}

// A product of two sizes, or nullopt when it overflows 64 bits.
std::optional<std::uint64_t> times(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// JSON text parsed with its nesting bounded; `what` names it in errors ("the safetensors header").
json parse_bounded_json(const char* first, const char* last, const std::string& path, const std::string& what,
                        const std::string& hint) {
  struct TooDeep {};
  try {
    return json::parse(first, last, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    bad(path, what + " nests JSON more than " + std::to_string(kMaxJsonDepth) + " levels deep", hint);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number too large
    bad(path, what + " is not valid JSON: " + e.what(), hint);
  }
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
void convert(Format f, const char* src, std::uint64_t n, T* out) {
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
  std::string path;
  RegularFile file;
  std::uint64_t buffer_offset = 0;  // 8 + header length
  struct Range {
    std::uint64_t begin, end;
  };
  std::map<std::string, Range> ranges;  // tensor name -> byte range in the buffer
  std::vector<TensorEntry> entries;     // in buffer order
};

RegularFile open_regular(const std::string& path) {
  std::string problem;
  std::optional<RegularFile> f = RegularFile::open(path, &problem);
  if (!f) throw UsageError("'" + path + "' " + problem);
  return std::move(*f);
}

// Reads exactly n bytes at `offset` of a file that was checked to hold them; a shorter read means
// the file changed (was truncated) since.
// `what`: the tensor read ("tensor 'w': "), or "" for the header.
void read_exactly(const RegularFile& f, const std::string& path, void* buf, std::size_t n, std::uint64_t offset,
                  const std::string& what = "") {
  const long long got = f.read_at(buf, n, offset);
  if (got < 0) bad(path, what + "cannot be read: " + std::strerror(errno));
  if (static_cast<std::size_t>(got) != n)
    bad(path, what + "it changed while it was read (it is now shorter than its header says)", "run again once nothing writes it");
}

// The dims of a JSON shape: an array of at most kMaxDims non-negative integers whose product is at
// most 2^62 (the element count is returned).
std::uint64_t safetensors_shape(const std::string& file, const std::string& name, const json& shape,
                                std::vector<std::int64_t>& dims) {
  if (!shape.is_array() || shape.size() > kMaxDims)
    bad(file, tensor_of(name) + ": \"shape\" is not an array of at most " + std::to_string(kMaxDims) + " integers");
  for (const auto& d : shape) {
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t{1} << 62))
      bad(file, tensor_of(name) + ": \"shape\" holds " + shown(d) + ", not a non-negative integer");
    dims.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
  }
  const std::optional<std::uint64_t> n = checked_elements(dims);
  if (!n) bad(file, tensor_of(name) + ": shape " + shown(shape) + " is too large (more than 2^62 elements)");
  return *n;
}

SafetensorsFile open_safetensors(const std::string& path) {
  SafetensorsFile f{path, open_regular(path), 0, {}, {}};
  const std::uint64_t size = f.file.size();
  const std::string hint = "the file is not a complete safetensors file (written by safetensors' save_file or "
                           "save_model); write it again";
  if (size < 8) bad(path, "too short for a safetensors header (" + std::to_string(size) + " bytes)", hint);
  unsigned char length[8];
  read_exactly(f.file, path, length, 8, 0);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | length[i];
  if (header_len > kMaxHeaderBytes)
    bad(path, "the header length " + std::to_string(header_len) + " is above safetensors' limit of 100 MB", hint);
  if (header_len > size - 8)
    bad(path, "truncated: the header claims " + std::to_string(header_len) + " bytes but the file has " +
                  std::to_string(size - 8) + " after the length field",
        hint);
  f.buffer_offset = 8 + header_len;
  const std::uint64_t buffer_size = size - f.buffer_offset;
  std::string text(static_cast<std::size_t>(header_len), '\0');
  read_exactly(f.file, path, text.data(), text.size(), 8);
  const json header = parse_bounded_json(text.data(), text.data() + text.size(), path, "the safetensors header", hint);
  text = std::string();
  if (!header.is_object()) bad(path, "the safetensors header is not a JSON object", hint);
  std::vector<std::pair<std::uint64_t, std::string>> order;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets") ||
        !info["dtype"].is_string())
      bad(path, tensor_of(name) + ": the header entry lacks \"dtype\", \"shape\" or \"data_offsets\"", hint);
    TensorEntry e;
    e.name = name;
    e.file = path;
    e.stored_type = info["dtype"].get<std::string>();
    e.format = safetensors_format(e.stored_type);
    const auto element_bytes = safetensors_element_bytes(e.stored_type);
    if (!element_bytes) bad(path, tensor_of(name) + ": unknown dtype " + quoted_name(e.stored_type), hint);
    e.elements = safetensors_shape(path, name, info["shape"], e.shape);
    const json& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(path, tensor_of(name) + ": \"data_offsets\" is not [begin, end]", hint);
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end || end > buffer_size)
      bad(path, tensor_of(name) + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                    "] point outside the " + std::to_string(buffer_size) + "-byte data buffer (truncated or damaged file)",
          hint);
    const std::optional<std::uint64_t> bytes = times(e.elements, *element_bytes);
    if (!bytes || end - begin != *bytes)
      bad(path, tensor_of(name) + ": data_offsets span " + std::to_string(end - begin) + " bytes but " + e.stored_type +
                    " of shape " + shown(info["shape"]) + " needs " +
                    (bytes ? std::to_string(*bytes) : std::string("more than 2^64")),
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
    if (begin < reached)
      bad(path, "tensors " + quoted_name(reached_by) + " and " + quoted_name(name) + " overlap in the data buffer", hint);
    reached = end;
    reached_by = name;
  }
  std::map<std::string, std::size_t> rank;
  for (std::size_t i = 0; i < order.size(); ++i) rank[order[i].second] = i;
  std::sort(f.entries.begin(), f.entries.end(),
            [&](const TensorEntry& a, const TensorEntry& b) { return rank[a.name] < rank[b.name]; });
  return f;
}

// Values of format f are stored with the bytes of a T in this machine's order (safetensors and the raw
// layouts here are little-endian).
template <class T>
bool stored_as_native(Format f) {
  const std::uint32_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  const bool little = first == 1;
  return little && ((std::is_same_v<T, float> && f == Format::fp32) || (std::is_same_v<T, double> && f == Format::fp64));
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
    for (const auto& s : shards_) out.push_back(s.path);
    return out;
  }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const override {
    read_as(t, begin, count, out);
  }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const override {
    read_as(t, begin, count, out);
  }
  // A safetensors buffer holds each tensor's little-endian bytes whole (checked at the open): native on a
  // little-endian machine.
  std::optional<StoredBytes> stored_bytes(const TensorEntry& t) const override {
    if (!stored_as_native<float>(Format::fp32)) return std::nullopt;
    const SafetensorsFile& f = shards_.at(where_.at(t.name));
    return StoredBytes{f.path, f.buffer_offset + f.ranges.at(t.name).begin};
  }

 private:
  // Positioned reads of the range, a piece at a time (never a mapping: a file truncated meanwhile is
  // a short read, named, where a mapped page past the new end would be a SIGBUS).
  template <class T>
  void read_as(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) const {
    const SafetensorsFile& f = shards_.at(where_.at(t.name));
    const std::size_t element = stored_element_bytes(*t.format);
    std::uint64_t at = f.buffer_offset + f.ranges.at(t.name).begin + begin * element;
    // Stored as the caller's type (F32 into float, F64 into double) on a little-endian machine (as
    // safetensors' bytes are): read straight into the caller's buffer, no piece and no conversion.
    if (stored_as_native<T>(*t.format)) {
      read_exactly(f.file, f.path, out, static_cast<std::size_t>(count * element), at, tensor_of(t.name) + ": ");
      return;
    }
    std::vector<char> piece(static_cast<std::size_t>(std::min<std::uint64_t>(count * element, kReadPiece)));
    const std::uint64_t per_piece = piece.size() / element;
    for (std::uint64_t done = 0; done < count;) {
      const std::uint64_t n = std::min(per_piece, count - done);
      read_exactly(f.file, f.path, piece.data(), static_cast<std::size_t>(n * element), at, tensor_of(t.name) + ": ");
      convert(*t.format, piece.data(), n, out + done);
      done += n;
      at += n * element;
    }
  }
  std::vector<SafetensorsFile> shards_;
  std::string index_;
  std::map<std::string, std::size_t> where_;
  std::vector<TensorEntry> entries_;
};

// A sharded checkpoint: {"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00002.safetensors"}}.
std::unique_ptr<TensorSource> open_safetensors_index(const std::string& path) {
  const std::string hint = "a sharded checkpoint's index is written by save_pretrained / huggingface_hub's "
                           "save_torch_state_dict next to its shards";
  std::string problem;
  const std::optional<std::string> text = read_regular_file(path, kMaxHeaderBytes, &problem);
  if (!text) throw UsageError("'" + path + "' " + problem, hint);
  const json index = parse_bounded_json(text->data(), text->data() + text->size(), path, "the index", hint);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    bad(path, "no \"weight_map\" object (tensor name -> shard file)", hint);
  std::map<std::string, std::string> shard_of;
  std::vector<std::string> shard_names;
  std::map<std::string, std::size_t> shard_index;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) bad(path, "weight_map[" + quoted_name(name) + "] is not a file name", hint);
    const std::string s = shard.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s.find('\0') != std::string::npos || s == "." || s == ".." ||
        !ends_with(s, ".safetensors"))
      bad(path, "weight_map[" + quoted_name(name) + "] = " + quoted_name(s) + " is not the name of a .safetensors file beside the index",
          "shards must lie in the index's own directory");
    shard_of[name] = s;
    if (shard_index.emplace(s, shard_names.size()).second) shard_names.push_back(s);
  }
  if (shard_of.empty()) bad(path, "the weight_map names no tensor", hint);
  const fs::path dir = fs::path(path).parent_path();
  std::vector<SafetensorsFile> shards;
  for (const auto& s : shard_names) {
    SafetensorsFile f = open_safetensors((dir / s).string());
    for (const auto& e : f.entries) {
      auto it = shard_of.find(e.name);
      if (it == shard_of.end())
        bad(f.path, tensor_of(e.name) + " is not in the weight_map of '" + path + "'", hint);
      if (it->second != s)
        bad(f.path, tensor_of(e.name) + " is also in this shard, but the index '" + path + "' maps it to " +
                        quoted_name(it->second),
            hint);
    }
    shards.push_back(std::move(f));
  }
  for (const auto& [name, s] : shard_of) {
    const auto& f = shards[shard_index.at(s)];
    if (f.ranges.count(name) == 0)
      bad(f.path, tensor_of(name) + " is missing: the index '" + path + "' says this shard holds it", hint);
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
  explicit Hdf5Source(const std::string& path) : file_(open_file(path)) { walk(); }
  const std::vector<TensorEntry>& tensors() const override { return entries_; }
  std::vector<std::string> files() const override { return {file_.path()}; }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const override {
    read_as(t, begin, count, out);
  }
  void read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const override {
    read_as(t, begin, count, out);
  }

 private:
  static constexpr const char* kHint = "write the tensors' data into the checkpoint itself (h5py: f.create_dataset(name, data=array))";

  h5::File open_file(const std::string& path) {
    // The type and size from a descriptor opened without blocking (a FIFO is refused, not waited for),
    // then HDF5 opens the file by name.
    file_bytes_ = open_regular(path).size();
    if (!h5::File::is_hdf5(path)) bad(path, "not an HDF5 file (no HDF5 signature): truncated, damaged or another format");
    try {
      return h5::File::open(path, false, nullptr);
    } catch (const h5::H5Error& e) {
      bad(path, "HDF5 cannot open it: " + e.details(), "the file is damaged or not written by HDF5; write it again");
    }
  }

  // Every dataset reachable from the root through hard and soft links, each object visited once (by
  // its address: a group linked from several places, or from inside itself, is walked once), groups at
  // most kMaxGroupDepth deep; an external or user-defined link is refused, never followed.
  void walk() {
    struct Pending {
      std::string object;  // the path that opens it ("/" for the root)
      std::string prefix;  // its tensors' name prefix ("a.b.")
      int depth;
    };
    const std::string& path = file_.path();
    std::set<std::pair<unsigned long, std::uint64_t>> visited;
    std::map<std::string, std::string> object_of_name;
    std::vector<Pending> pending{{"/", "", 0}};
    const h5::Group root = file_.root();
    while (!pending.empty()) {
      const Pending p = std::move(pending.back());
      pending.pop_back();
      const h5::Group g = p.object == "/" ? file_.root() : root.open_group(p.object.substr(1));
      for (const std::string& child : g.children()) {
        const std::string object = (p.object == "/" ? "/" : p.object + "/") + child;
        const h5::LinkInfo link = g.link(child);
        if (link.type == h5::LinkInfo::Type::external)
          bad(path, "'" + object + "' is an external link to " + quoted_name(link.target) +
                        ": fastudy reads only the data in the checkpoint itself (and never opens another file through it)",
              kHint);
        if (link.type == h5::LinkInfo::Type::other)
          bad(path, "'" + object + "' is a user-defined link (class " + link.target + "), which fastudy does not follow", kHint);
        if (link.type == h5::LinkInfo::Type::soft && g.child_kind(child) == h5::Group::Kind::other) continue;  // dangling
        const h5::Group::Object o = g.object(child);
        if (o.kind == h5::Group::Kind::other || !visited.emplace(o.fileno, o.address).second) continue;
        const std::string name = p.prefix + child;
        if (o.kind == h5::Group::Kind::group) {
          if (p.depth + 1 > kMaxGroupDepth)
            bad(path, "groups nest more than " + std::to_string(kMaxGroupDepth) + " levels deep at '" + object + "'");
          pending.push_back({object, name + ".", p.depth + 1});
          continue;
        }
        if (auto [it, fresh] = object_of_name.emplace(name, object); !fresh)
          bad(path, "datasets '" + it->second + "' and '" + object + "' both read as " + tensor_of(name),
              "rename one of them in the file");
        add_dataset(root.open_dataset(object.substr(1)), name, object);
      }
    }
  }

  void add_dataset(const h5::Dataset& d, const std::string& name, const std::string& object) {
    const std::string& path = file_.path();
    TensorEntry e;
    e.name = name;
    e.file = path;
    const h5::StoredType t = d.stored_type();
    e.format = hdf5_format(t);
    e.stored_type = hdf5_type_word(t);
    e.shape = d.shape();
    const std::optional<std::uint64_t> elements = checked_elements(e.shape);
    if (!elements) bad(path, tensor_of(name) + ": its shape holds more than 2^62 elements");
    e.elements = *elements;
    if (e.format && e.elements > 0) {
      // What reading it would touch: only this file, and only bytes that were written.
      const h5::StorageInfo s = d.storage();
      if (s.layout == h5::StorageInfo::Layout::virtual_)
        bad(path, tensor_of(name) + " is a virtual dataset: its data lies in other files", kHint);
      if (s.external_files > 0) bad(path, tensor_of(name) + " keeps its data in external files", kHint);
      if (!s.allocated)
        bad(path, tensor_of(name) + ": not every element was ever written (HDF5 would read its fill value instead)",
            "the run that wrote the checkpoint did not finish it; write it again");
      const std::uint64_t logical = *times(e.elements, stored_element_bytes(*e.format));  // <= 2^62 * 8
      if (s.stored_bytes > file_bytes_)
        bad(path, tensor_of(name) + " claims " + std::to_string(s.stored_bytes) + " bytes of storage, more than the file's " +
                      std::to_string(file_bytes_) + " (truncated or damaged file)");
      const std::optional<std::uint64_t> bound = times(s.stored_bytes, s.filters == 0 ? 1 : kMaxExpansion);
      if (bound && logical > *bound)
        bad(path, tensor_of(name) + ": " + std::to_string(e.elements) + " elements cannot come from its " +
                      std::to_string(s.stored_bytes) + " stored bytes" +
                      (s.filters == 0 ? std::string() : " (more than deflate's 1032:1 compression)") + " (damaged file)",
            "write it again, without compression filters other than gzip");
    }
    object_of_[name] = object;
    entries_.push_back(std::move(e));
  }

  // The whole rows (slices along the first dimension) that hold the range, read and converted by
  // HDF5, then the range copied out.
  template <class T>
  void read_as(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) const {
    const h5::Dataset d = file_.root().open_dataset(object_of_.at(t.name).substr(1));
    if (count == 0) return;
    const std::uint64_t rows = t.shape.empty() ? 1 : static_cast<std::uint64_t>(t.shape[0]);
    const std::uint64_t per_row = t.elements / rows;
    const std::uint64_t row0 = begin / per_row, row1 = (begin + count - 1) / per_row + 1;
    std::vector<T> buf(static_cast<std::size_t>((row1 - row0) * per_row));
    d.read_rows_converted(buf.data(), static_cast<std::int64_t>(row0), static_cast<std::int64_t>(row1 - row0));
    std::copy_n(buf.begin() + static_cast<std::ptrdiff_t>(begin - row0 * per_row), count, out);
  }

  std::uint64_t file_bytes_ = 0;
  h5::File file_;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> object_of_;  // tensor name -> the path that opens its dataset
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

namespace detail {

void name_errors(const std::string& file, const std::string& tensor, const std::function<void()>& f) {
  const std::string what = tensor.empty() ? std::string() : tensor_of(tensor) + ": ";
  try {
    f();
  } catch (const UsageError&) {
    throw;
  } catch (const h5::H5Error& e) {
    bad(file, what + "HDF5 cannot read it: " + e.details(), "the file is damaged; write it again");
  } catch (const std::bad_alloc&) {
    bad(file, what + "there is not enough memory to read it", "read it on a host with more memory, or exclude the tensor");
  } catch (const std::exception& e) {
    bad(file, what + "cannot be read: " + one_line(e.what()).substr(0, 500), "the file is damaged or not of its kind; write it again");
  }
}

std::unique_ptr<TensorSource> open_hdf5_here(const std::string& path) { return std::make_unique<Hdf5Source>(path); }

}  // namespace detail

std::size_t stored_element_bytes(Format f) {
  switch (f) {
    case Format::fp64: return 8;
    case Format::fp32: return 4;
    case Format::fp16:
    case Format::bf16: return 2;
    default: return 1;
  }
}

std::optional<std::uint64_t> checked_elements(const std::vector<std::int64_t>& dims) {
  std::uint64_t n = 1;
  for (const auto d : dims) {
    if (d < 0) return std::nullopt;
    const auto v = static_cast<std::uint64_t>(d);
    if (v != 0 && n > (std::uint64_t{1} << 62) / v) return std::nullopt;
    n *= v;
  }
  return n;
}

void register_tensor_format(const std::string& extension, TensorSourceOpener opener) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.openers[extension] = std::move(opener);
}

TensorFile TensorFile::open(const std::string& path) {
  std::unique_ptr<TensorSource> source;
  detail::name_errors(path, "", [&] {
    if (ends_with(path, ".safetensors.index.json")) {
      source = open_safetensors_index(path);
    } else if (ends_with(path, ".safetensors")) {
      std::vector<SafetensorsFile> one;
      one.push_back(open_safetensors(path));
      source = std::make_unique<SafetensorsSource>(std::move(one), "");
    } else if (ends_with(path, ".h5") || ends_with(path, ".hdf5")) {
      // libhdf5 parses the file in the reader process where one was started (hdf5_reader.hpp).
      source = hdf5_reader_started() ? open_hdf5_in_reader(path) : detail::open_hdf5_here(path);
    } else {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      for (const auto& [extension, opener] : r.openers)
        if (ends_with(path, extension)) {
          source = opener(path);
          return;
        }
    }
  });
  if (source) return TensorFile(path, std::move(source));
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

template <class T>
void TensorFile::checked_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, T* out) const {
  if (!t.format)
    bad(t.file, tensor_of(t.name) + " holds " + t.stored_type + " values; fastudy reads F64, F32, F16 and BF16");
  if (begin > t.elements || count > t.elements - begin)
    throw Error("tensor_file: elements [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ") of " +
                tensor_of(t.name) + " in '" + t.file + "', which has " + std::to_string(t.elements));
  detail::name_errors(t.file, t.name, [&] { source_->read_range(t, begin, count, out); });
}

void TensorFile::read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const {
  checked_range(t, begin, count, out);
}
void TensorFile::read_range(const TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const {
  checked_range(t, begin, count, out);
}
void TensorFile::read(const TensorEntry& t, double* out) const { checked_range(t, 0, t.elements, out); }
void TensorFile::read(const TensorEntry& t, float* out) const { checked_range(t, 0, t.elements, out); }

}  // namespace fastudy::io
