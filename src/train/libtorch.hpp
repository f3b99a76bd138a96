// The LibTorch headers the trainer's sources use, and no more: tensors with the torch:: names and
// factories (torch/types.h), torch::NoGradGuard and manual_seed (torch/utils.h), custom autograd
// functions and torch::autograd::grad. About half the parse time of <torch/torch.h>, which adds the
// nn modules, optimizers, data loaders, serialization and the JIT (measured: 11 s against 20 s of CPU
// per file on GCC 12 with Debian's LibTorch 1.13; docs/build.md "Build time").
//
// Headers keep to <ATen/core/Tensor.h> (at::Tensor, at::ScalarType, at::Device); the .cpp files that
// call LibTorch's ops include this file. fastudy_train precompiles it (src/train/CMakeLists.txt).
#pragma once

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>
#include <torch/utils.h>
