// torch.save files (.pt, .pth, .bin) as tensor files (src/io/tensor_file.hpp), read by LibTorch's own
// reader (torch::pickle_load). Torch-free header: fastudy-main registers the reader at start-up;
// fastudy-lite, which does not link LibTorch, refuses such files with a hint.
//
// What Debian's LibTorch 1.13 can read: torch.save's zip format (PyTorch >= 1.6's default) holding a
// dict of tensors, nested dicts becoming name prefixes ("model.w"), other values (ints, strings) left
// out. What it cannot: a state_dict() saved as it is (a collections.OrderedDict, which its unpickler
// turns into None), and the legacy non-zip format; both are refused with a hint to convert.
#pragma once

namespace fastudy::train {

// Registers the reader for ".pt", ".pth" and ".bin" with io::register_tensor_format.
void register_torch_save_reader();

}  // namespace fastudy::train
