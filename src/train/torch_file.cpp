// The torch.save reader: LibTorch's zip reader (caffe2::serialize::PyTorchStreamReader) over positioned
// reads of the file, the pickle program (data.pkl) checked by io::pickle_problem, then run by
// LibTorch's own unpickler as torch::pickle_load runs it (torch/csrc/jit/serialization/import_read.cpp,
// readArchiveAndTensors) but with every storage record's size kept, so that each tensor's view (sizes,
// strides, storage offset) is checked against the bytes its storage really holds before a value is
// read: LibTorch 1.13's rebuildTensor sets whatever view the pickle says, and a view past its storage
// reads the heap.
#include "src/train/torch_file.hpp"

#include <torch/torch.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "base/error.hpp"
#include "base/quote.hpp"
#include "base/read_file.hpp"
#include "src/io/pickle_scan.hpp"
#include "src/io/tensor_file.hpp"

namespace fastudy::train {
namespace {

const char* kConvertHint =
    "LibTorch 1.13 reads torch.save files (zip format) that hold plain dicts of tensors: save "
    "dict(model.state_dict()) instead of model.state_dict(), or write safetensors "
    "(safetensors.torch.save_file(model.state_dict(), 'model.safetensors'))";
const char* kDamagedHint = "the file is damaged or was not written by torch.save; write it again";

std::optional<Format> format_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return Format::fp64;
    case c10::ScalarType::Float: return Format::fp32;
    case c10::ScalarType::Half: return Format::fp16;
    case c10::ScalarType::BFloat16: return Format::bf16;
    default: return std::nullopt;
  }
}

// The zip reader's view of the file: positioned reads of a regular file opened without blocking.
class FileReadAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  FileReadAdapter(RegularFile file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}
  size_t size() const override { return static_cast<size_t>(file_.size()); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    const long long got = file_.read_at(buf, n, pos);
    if (got < 0) throw UsageError("'" + path_ + "': cannot be read: " + std::strerror(errno));
    return static_cast<size_t>(got);
  }

 private:
  RegularFile file_;
  std::string path_;
};

std::string dims_text(c10::IntArrayRef d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The bytes of its storage that the view of t reaches (the element after its last one, times the
// element size), or nullopt for a negative stride or offset or a product past 2^63.
std::optional<std::uint64_t> view_bytes(const at::Tensor& t) {
  const auto sizes = t.sizes(), strides = t.strides();
  if (t.storage_offset() < 0) return std::nullopt;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || strides[i] < 0) return std::nullopt;
    if (sizes[i] == 0) return 0;
  }
  std::int64_t last = t.storage_offset();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::int64_t step = 0;
    if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &step) || __builtin_add_overflow(last, step, &last))
      return std::nullopt;
  }
  std::int64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, static_cast<std::int64_t>(t.element_size()), &bytes))
    return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

class TorchSaveSource : public io::TensorSource {
 public:
  explicit TorchSaveSource(const std::string& path) : path_(path) {
    std::string problem;
    std::optional<RegularFile> file = RegularFile::open(path, &problem);
    if (!file) throw UsageError("'" + path + "' " + problem);
    c10::IValue root;
    try {
      root = load(std::move(*file));
    } catch (const UsageError&) {
      throw;
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      const bool ordered_dict = what.find("Expected GenericDict but got None") != std::string::npos;
      throw UsageError("'" + path + "': LibTorch " + std::string(TORCH_VERSION) + " cannot read this torch.save file (" +
                           (ordered_dict ? std::string("it holds a collections.OrderedDict, e.g. a state_dict() saved as is")
                                         : one_line(what.substr(0, what.find('\n'))).substr(0, 300)) +
                           ")",
                       kConvertHint);
    } catch (const std::bad_alloc&) {
      throw UsageError("'" + path + "': there is not enough memory to read it", "read it on a host with more memory");
    } catch (const std::exception& e) {  // the zip reader's and unpickler's other errors (std::stoull, vector::at)
      throw UsageError("'" + path + "': LibTorch " + std::string(TORCH_VERSION) + " cannot read this torch.save file (" +
                           one_line(e.what()).substr(0, 300) + ")",
                       kDamagedHint);
    }
    if (!root.isGenericDict())
      throw UsageError("'" + path + "': the torch.save file holds a " + root.tagKind() + ", not a dict of tensors", kConvertHint);
    walk(root);
    if (entries_.empty()) throw UsageError("'" + path + "': the torch.save file holds no tensor", kConvertHint);
  }
  const std::vector<io::TensorEntry>& tensors() const override { return entries_; }
  std::vector<std::string> files() const override { return {path_}; }
  void read_range(const io::TensorEntry& t, std::uint64_t begin, std::uint64_t count, double* out) const override {
    copy(t, begin, count, out, torch::kFloat64);
  }
  void read_range(const io::TensorEntry& t, std::uint64_t begin, std::uint64_t count, float* out) const override {
    copy(t, begin, count, out, torch::kFloat32);
  }

 private:
  // readArchiveAndTensors("data", ...) of torch::pickle_load, with the pickle checked first and the
  // size of every storage record kept (by the address of its data).
  c10::IValue load(RegularFile file) {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<FileReadAdapter>(std::move(file), path_));
    at::DataPtr pickle;
    std::size_t pickle_size = 0;
    std::tie(pickle, pickle_size) = reader.getRecord("data.pkl");
    const char* data = static_cast<const char*>(pickle.get());
    if (auto problem = io::pickle_problem(data, pickle_size))
      throw UsageError("'" + path_ + "': its pickle (data.pkl) " + *problem, kDamagedHint);
    std::size_t read = 0;
    auto pickle_reader = [&](char* buf, std::size_t len) -> std::size_t {
      len = std::min(len, pickle_size - read);
      std::memcpy(buf, data + read, len);
      read += len;
      return len;
    };
    auto read_record = [&](const std::string& name) {
      auto [ptr, size] = reader.getRecord("data/" + name);
      record_bytes_[ptr.get()] = size;
      return std::move(ptr);
    };
    torch::jit::Unpickler unpickler(pickle_reader, nullptr, nullptr, read_record, c10::Device(c10::kCPU));
    unpickler.set_version(reader.version());
    return unpickler.parse_ivalue();
  }

  // The dicts under the root, each walked once (a dict reached again, or from inside itself, is not),
  // nested dicts becoming name prefixes; every tensor's view checked against its storage's bytes.
  void walk(const c10::IValue& root) {
    struct Pending {
      c10::IValue dict;
      std::string prefix;
      int depth;
    };
    std::set<const void*> seen{root.internalToPointer()};
    std::vector<Pending> pending{{root, "", 0}};
    while (!pending.empty()) {
      const Pending p = std::move(pending.back());
      pending.pop_back();
      for (const auto& kv : p.dict.toGenericDict()) {
        if (!kv.key().isString()) continue;
        const std::string name = p.prefix + kv.key().toStringRef();
        const c10::IValue& v = kv.value();
        if (v.isGenericDict()) {
          if (p.depth + 1 > io::kMaxPickleDepth)
            throw UsageError("'" + path_ + "': dicts nest more than " + std::to_string(io::kMaxPickleDepth) + " levels deep", kDamagedHint);
          if (seen.insert(v.internalToPointer()).second) pending.push_back({v, name + ".", p.depth + 1});
        } else if (v.isTensor()) {
          add(name, v.toTensor());
        }
      }
    }
  }

  void add(const std::string& name, const at::Tensor& t) {
    io::TensorEntry e;
    e.name = name;
    e.file = path_;
    e.stored_type = c10::toString(t.scalar_type());
    const bool strided = t.layout() == c10::kStrided && !t.is_quantized();
    if (!strided) e.stored_type += " (" + std::string(t.is_quantized() ? "quantized" : "sparse") + ")";
    e.format = strided ? format_of(t.scalar_type()) : std::nullopt;
    for (auto d : t.sizes()) e.shape.push_back(d);
    const std::optional<std::uint64_t> elements = io::checked_elements(e.shape);
    if (!elements)
      throw UsageError("'" + path_ + "': tensor " + quoted_name(name) + " has shape " + dims_text(t.sizes()) +
                           " (a negative size, or more than 2^62 elements)",
                       kDamagedHint);
    e.elements = *elements;
    if (strided) {
      const auto it = record_bytes_.find(t.storage().data());
      const std::uint64_t have = it == record_bytes_.end() ? 0 : it->second;
      const std::optional<std::uint64_t> need = view_bytes(t);
      if (!need || *need > have)
        throw UsageError("'" + path_ + "': tensor " + quoted_name(name) + " is a view (sizes " + dims_text(t.sizes()) +
                             ", strides " + dims_text(t.strides()) + ", offset " + std::to_string(t.storage_offset()) +
                             ") that reaches past the " + std::to_string(have) + " bytes its storage holds",
                         kDamagedHint);
    }
    tensors_[name] = t;
    entries_.push_back(std::move(e));
  }

  template <class T>
  void copy(const io::TensorEntry& e, std::uint64_t begin, std::uint64_t count, T* out, torch::ScalarType to) const {
    const torch::Tensor t = tensors_.at(e.name)
                                .reshape({-1})
                                .slice(0, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(begin + count))
                                .to(to)
                                .contiguous();
    std::memcpy(out, t.data_ptr(), count * sizeof(T));
  }

  std::string path_;
  std::map<const void*, std::uint64_t> record_bytes_;
  std::vector<io::TensorEntry> entries_;
  std::map<std::string, torch::Tensor> tensors_;
};

}  // namespace

void register_torch_save_reader() {
  for (const char* extension : {".pt", ".pth", ".bin"})
    io::register_tensor_format(extension, [](const std::string& path) -> std::unique_ptr<io::TensorSource> {
      return std::make_unique<TorchSaveSource>(path);
    });
}

}  // namespace fastudy::train
