// The scan of a torch.save pickle program (pickle_scan.hpp). The opcodes and their operands are
// Python's (Lib/pickletools.py); the subset and the stack effects are those of LibTorch's unpickler
// (torch/csrc/jit/serialization/unpickler.cpp, Unpickler::readInstruction): a GLOBAL pushes the index
// of a rebuild function, REDUCE and BUILD pop it and its argument and push the result, NEWOBJ pops one
// item, BINPERSID pops the storage's key tuple and pushes a tensor.
#include "src/io/pickle_scan.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace fastudy::io {
namespace {

// A stack item: a container the program built (a node of the containment graph) or a leaf value.
constexpr std::int64_t kLeaf = -1;
// The longest GLOBAL module or class name LibTorch would look up ("torch._utils", "_rebuild_tensor_v2").
constexpr std::size_t kMaxGlobalName = 256;

struct Problem {
  std::string what;
};

class Scan {
 public:
  Scan(const char* data, std::size_t size) : p_(reinterpret_cast<const unsigned char*>(data)), n_(size) {}

  void run() {
    const unsigned char first = byte();
    if (first != 0x80) fail("does not start with PROTO (0x80): it is no pickle LibTorch reads");
    if (const unsigned char protocol = byte(); protocol != 2)
      fail("uses pickle protocol " + std::to_string(protocol) + "; LibTorch reads protocol 2 (torch.save's)");
    for (;;) {
      const std::size_t at = at_;
      const unsigned char op = byte();
      if (step(op, at)) break;
    }
    if (stack_.size() != 1 || !marks_.empty())
      fail("ends (STOP) with " + std::to_string(stack_.size()) + " items on its stack, not the one object it builds");
    check_depth(stack_.front());
  }

 private:
  [[noreturn]] void fail(const std::string& what) { throw Problem{what}; }

  unsigned char byte() {
    if (at_ >= n_) fail("is truncated at byte " + std::to_string(at_) + " (no STOP)");
    return p_[at_++];
  }
  std::uint64_t little(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(byte()) << (8 * i);
    return v;
  }
  void skip(std::uint64_t bytes, std::size_t op_at) {
    if (bytes > n_ - at_)
      fail("is truncated: the operand of the opcode at byte " + std::to_string(op_at) + " needs " + std::to_string(bytes) +
           " bytes, " + std::to_string(n_ - at_) + " are left");
    at_ += static_cast<std::size_t>(bytes);
  }
  // A newline-terminated name (GLOBAL's module and class).
  void line(std::size_t op_at) {
    const std::size_t start = at_;
    while (byte() != '\n')
      if (at_ - start > kMaxGlobalName) fail("names a GLOBAL longer than " + std::to_string(kMaxGlobalName) + " bytes at byte " + std::to_string(op_at));
  }

  // The items above the topmost MARK (the current frame), at least `k` of them.
  std::size_t frame() const { return marks_.empty() ? 0 : marks_.back(); }
  void need(std::size_t k, std::size_t op_at) {
    if (stack_.size() - frame() < k)
      fail("pops " + std::to_string(k) + " item(s) at byte " + std::to_string(op_at) + " where its stack (above the last MARK) holds " +
           std::to_string(stack_.size() - frame()));
  }
  std::int64_t pop() {
    const std::int64_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::int64_t node() {
    edges_.emplace_back();
    return static_cast<std::int64_t>(edges_.size() - 1);
  }
  void contain(std::int64_t container, std::int64_t item) {
    if (item != kLeaf) edges_[static_cast<std::size_t>(container)].push_back(item);
  }
  // Pops the items above the topmost MARK and the MARK; returns them.
  std::vector<std::int64_t> pop_frame(std::size_t op_at) {
    if (marks_.empty()) fail("needs a MARK at byte " + std::to_string(op_at) + " and has none");
    const std::size_t start = marks_.back();
    marks_.pop_back();
    std::vector<std::int64_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(start), stack_.end());
    stack_.resize(start);
    return items;
  }
  // The container below the topmost MARK that APPENDS/SETITEMS fill: it must be in the frame below.
  std::int64_t below_mark(std::size_t op_at) {
    if (marks_.empty()) fail("needs a MARK at byte " + std::to_string(op_at) + " and has none");
    const std::size_t start = marks_.back();
    const std::size_t outer = marks_.size() > 1 ? marks_[marks_.size() - 2] : 0;
    if (start == 0 || start - 1 < outer) fail("fills a container at byte " + std::to_string(op_at) + " that is not on its stack");
    const std::int64_t c = stack_[start - 1];
    if (c == kLeaf) fail("fills something that is no list or dict at byte " + std::to_string(op_at));
    return c;
  }

  // Runs one opcode; true at STOP.
  bool step(unsigned char op, std::size_t at) {
    switch (op) {
      case '.':  // STOP
        return true;
      case '(':  // MARK
        marks_.push_back(stack_.size());
        break;
      case ']':  // EMPTY_LIST
      case '}':  // EMPTY_DICT
        stack_.push_back(node());
        break;
      case ')':  // EMPTY_TUPLE (one shared empty tuple)
      case 0x88:  // NEWTRUE
      case 0x89:  // NEWFALSE
      case 'N':  // NONE
        stack_.push_back(kLeaf);
        break;
      case 'K':  // BININT1
        skip(1, at);
        stack_.push_back(kLeaf);
        break;
      case 'M':  // BININT2
        skip(2, at);
        stack_.push_back(kLeaf);
        break;
      case 'J':  // BININT
        skip(4, at);
        stack_.push_back(kLeaf);
        break;
      case 'G':  // BINFLOAT
        skip(8, at);
        stack_.push_back(kLeaf);
        break;
      case 0x8a:  // LONG1: a length byte, then that many bytes
        skip(byte(), at);
        stack_.push_back(kLeaf);
        break;
      case 'X':  // BINUNICODE: a 4-byte length, then the UTF-8 bytes
        skip(little(4), at);
        stack_.push_back(kLeaf);
        break;
      case 'q':  // BINPUT
      case 'r': {  // LONG_BINPUT
        const std::uint64_t i = little(op == 'q' ? 1 : 4);
        need(1, at);
        if (i > memo_.size())
          fail("stores memo entry " + std::to_string(i) + " at byte " + std::to_string(at) + " while the memo holds " +
               std::to_string(memo_.size()) + " (a pickler fills it in order)");
        if (i == memo_.size()) memo_.push_back(stack_.back());
        else memo_[static_cast<std::size_t>(i)] = stack_.back();
        break;
      }
      case 'h':  // BINGET
      case 'j': {  // LONG_BINGET
        const std::uint64_t i = little(op == 'h' ? 1 : 4);
        if (i >= memo_.size())
          fail("reads memo entry " + std::to_string(i) + " at byte " + std::to_string(at) + ", which was never stored");
        stack_.push_back(memo_[static_cast<std::size_t>(i)]);
        break;
      }
      case 't': {  // TUPLE
        const std::int64_t t = node();
        for (std::int64_t item : pop_frame(at)) contain(t, item);
        stack_.push_back(t);
        break;
      }
      case 0x85:  // TUPLE1
      case 0x86:  // TUPLE2
      case 0x87: {  // TUPLE3
        const std::size_t k = static_cast<std::size_t>(op - 0x84);
        need(k, at);
        const std::int64_t t = node();
        for (std::size_t i = 0; i < k; ++i) contain(t, pop());
        stack_.push_back(t);
        break;
      }
      case 'l': {  // LIST
        const std::int64_t l = node();
        for (std::int64_t item : pop_frame(at)) contain(l, item);
        stack_.push_back(l);
        break;
      }
      case 'd': {  // DICT
        const std::vector<std::int64_t> items = pop_frame(at);
        if (items.size() % 2 != 0) fail("builds a dict at byte " + std::to_string(at) + " from an odd number of items");
        const std::int64_t d = node();
        for (std::int64_t item : items) contain(d, item);
        stack_.push_back(d);
        break;
      }
      case 'e': {  // APPENDS
        const std::int64_t l = below_mark(at);
        for (std::int64_t item : pop_frame(at)) contain(l, item);
        break;
      }
      case 'u': {  // SETITEMS
        const std::int64_t d = below_mark(at);
        const std::vector<std::int64_t> items = pop_frame(at);
        if (items.size() % 2 != 0) fail("sets dict items at byte " + std::to_string(at) + " from an odd number of items");
        for (std::int64_t item : items) contain(d, item);
        break;
      }
      case 's': {  // SETITEM
        need(3, at);
        const std::int64_t value = pop(), key = pop();
        const std::int64_t d = stack_.back();
        if (d == kLeaf) fail("sets an item of something that is no dict at byte " + std::to_string(at));
        contain(d, key);
        contain(d, value);
        break;
      }
      case 'c':  // GLOBAL: module and class, each ending with a newline; pushes the function's index
        line(at);
        line(at);
        stack_.push_back(kLeaf);
        break;
      case 0x81:  // NEWOBJ (LibTorch drops its argument tuple)
        need(1, at);
        pop();
        break;
      case 'R':  // REDUCE
      case 'b': {  // BUILD (the same in LibTorch): pops the function's index and its argument
        need(2, at);
        const std::int64_t arg = pop();
        pop();
        const std::int64_t r = node();
        contain(r, arg);
        stack_.push_back(r);
        break;
      }
      case 'Q':  // BINPERSID: a storage's key tuple -> a tensor
        need(1, at);
        pop();
        stack_.push_back(kLeaf);
        break;
      default: {
        char text[64];
        std::snprintf(text, sizeof text, "0x%02x", static_cast<unsigned>(op));
        fail(std::string("holds opcode ") + text + " at byte " + std::to_string(at) +
             ", which LibTorch's unpickler does not read (a torch.save file of another protocol, or damaged)");
      }
    }
    return false;
  }

  // The depth of the containers under `root` (a node counts 1), by an iterative depth-first walk;
  // a container reached again while it is being walked holds itself.
  void check_depth(std::int64_t root) {
    if (root == kLeaf) return;
    enum : std::uint8_t { kNew, kOpen, kDone };
    std::vector<std::uint8_t> state(edges_.size(), kNew);
    std::vector<int> depth(edges_.size(), 0);
    struct Frame {
      std::size_t node, next;
    };
    std::vector<Frame> path{{static_cast<std::size_t>(root), 0}};
    state[static_cast<std::size_t>(root)] = kOpen;
    while (!path.empty()) {
      Frame& f = path.back();
      const std::vector<std::int64_t>& out = edges_[f.node];
      if (f.next < out.size()) {
        const auto child = static_cast<std::size_t>(out[f.next++]);
        if (state[child] == kOpen) fail("builds a container that holds itself");
        if (state[child] == kNew) {
          if (path.size() >= static_cast<std::size_t>(kMaxPickleDepth))
            fail("nests containers more than " + std::to_string(kMaxPickleDepth) + " levels deep");
          state[child] = kOpen;
          path.push_back({child, 0});
        }
        continue;
      }
      int d = 0;
      for (std::int64_t c : out) d = std::max(d, depth[static_cast<std::size_t>(c)]);
      depth[f.node] = d + 1;
      if (depth[f.node] > kMaxPickleDepth) fail("nests containers more than " + std::to_string(kMaxPickleDepth) + " levels deep");
      state[f.node] = kDone;
      path.pop_back();
    }
  }

  const unsigned char* p_;
  std::size_t n_;
  std::size_t at_ = 0;
  std::vector<std::int64_t> stack_;
  std::vector<std::size_t> marks_;
  std::vector<std::int64_t> memo_;
  std::vector<std::vector<std::int64_t>> edges_;  // container -> the containers it holds
};

}  // namespace

std::optional<std::string> pickle_problem(const char* data, std::size_t size) {
  try {
    Scan(data, size).run();
    return std::nullopt;
  } catch (const Problem& p) {
    return p.what;
  }
}

}  // namespace fastudy::io
