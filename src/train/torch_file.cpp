// The torch.save reader: torch::pickle_load on the file's bytes, then a walk of the dicts it holds.
#include "src/train/torch_file.hpp"

#include <torch/serialize.h>
#include <torch/version.h>

#include <fstream>
#include <iterator>
#include <map>

#include "base/error.hpp"
#include "src/io/tensor_file.hpp"

namespace fastudy::train {
namespace {

const char* kConvertHint =
    "LibTorch 1.13 reads torch.save files (zip format) that hold plain dicts of tensors: save "
    "dict(model.state_dict()) instead of model.state_dict(), or write safetensors "
    "(safetensors.torch.save_file(model.state_dict(), 'model.safetensors'))";

std::optional<Format> format_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Double: return Format::fp64;
    case c10::ScalarType::Float: return Format::fp32;
    case c10::ScalarType::Half: return Format::fp16;
    case c10::ScalarType::BFloat16: return Format::bf16;
    default: return std::nullopt;
  }
}

class TorchSaveSource : public io::TensorSource {
 public:
  explicit TorchSaveSource(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError("'" + path + "': cannot open it");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    c10::IValue root;
    try {
      root = torch::pickle_load(bytes);
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      const bool ordered_dict = what.find("Expected GenericDict but got None") != std::string::npos;
      throw UsageError("'" + path + "': LibTorch " + std::string(TORCH_VERSION) + " cannot read this torch.save file (" +
                           (ordered_dict ? std::string("it holds a collections.OrderedDict, e.g. a state_dict() saved as is")
                                         : what.substr(0, what.find('\n'))) +
                           ")",
                       kConvertHint);
    }
    if (!root.isGenericDict()) throw UsageError("'" + path + "': the torch.save file holds a " + root.tagKind() + ", not a dict of tensors", kConvertHint);
    walk(root.toGenericDict(), "");
    if (entries_.empty()) throw UsageError("'" + path + "': the torch.save file holds no tensor", kConvertHint);
  }
  const std::vector<io::TensorEntry>& tensors() const override { return entries_; }
  std::vector<std::string> files() const override { return {path_}; }
  void read(const io::TensorEntry& t, double* out) const override { copy(t, out, torch::kFloat64); }
  void read(const io::TensorEntry& t, float* out) const override { copy(t, out, torch::kFloat32); }

 private:
  void walk(const c10::impl::GenericDict& dict, const std::string& prefix) {
    for (const auto& kv : dict) {
      if (!kv.key().isString()) continue;
      const std::string name = prefix + kv.key().toStringRef();
      const c10::IValue& v = kv.value();
      if (v.isGenericDict()) {
        walk(v.toGenericDict(), name + ".");
      } else if (v.isTensor()) {
        const torch::Tensor t = v.toTensor();
        io::TensorEntry e;
        e.name = name;
        e.file = path_;
        e.format = format_of(t.scalar_type());
        e.stored_type = c10::toString(t.scalar_type());
        for (auto d : t.sizes()) e.shape.push_back(d);
        e.elements = static_cast<std::uint64_t>(t.numel());
        tensors_[name] = t;
        entries_.push_back(std::move(e));
      }
    }
  }
  template <class T>
  void copy(const io::TensorEntry& e, T* out, torch::ScalarType to) const {
    const torch::Tensor t = tensors_.at(e.name).to(to).contiguous();
    std::memcpy(out, t.data_ptr(), e.elements * sizeof(T));
  }
  std::string path_;
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
