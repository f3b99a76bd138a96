// A check of the pickle program inside a torch.save file (its data.pkl) before LibTorch's unpickler
// runs it. LibTorch 1.13's unpickler (torch/csrc/jit/serialization/unpickler.cpp) trusts its input:
// containers nested 10^5 deep are built without a bound and then freed recursively (a stack
// overflow), a dict built from an odd number of stack items reads past its stack, and a memo index of
// 2^32 grows its memo table to match. This scan runs the same program over a stack of placeholders
// (no value is built): every opcode is one LibTorch's unpickler knows (protocol 2), every operand lies
// within the bytes, no opcode pops below its MARK or past the bottom of the stack, a dict gets keys and
// values in pairs, the memo is filled in order, and the containers the program builds form no cycle
// and nest at most kMaxPickleDepth deep (followed through the memo, so a chain of memoized lists
// linked after the fact counts at its real depth). Time and memory are linear in the bytes.
//
//   if (auto problem = pickle_problem(data, size)) throw UsageError("'f.pt': its pickle " + *problem);
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace fastudy::io {

// Containers within containers that a torch.save file may build: a state dict's tensor is 4 deep (the
// dict, the rebuild call, its argument tuple, the size tuple), each module level adds one.
inline constexpr int kMaxPickleDepth = 64;

// nullopt when the pickle program is safe to hand to LibTorch; otherwise what is wrong with it and
// where ("holds opcode 0x63 ('c') at byte 17, which ...", "nests containers more than 64 deep").
std::optional<std::string> pickle_problem(const char* data, std::size_t size);

}  // namespace fastudy::io
