// The decoder's and encoder's layers as the runtime holds them, and the memory the search caches reuse.
#pragma once

#include "linear.h"

namespace {

struct Layer {
  Linear qkv, self_out, cross_q, cross_out, fc1, fc2, cross_kv;  // cross_kv: [W_k; W_v] of cross-attention
  Tensor norm1_w, norm1_b, norm2_w, norm2_b, norm3_w, norm3_b;
};

struct EncoderLayer {
  Linear qkv, out, fc1, fc2;
  Tensor norm1_w, norm1_b, norm2_w, norm2_b;
};

// Memory the search caches reuse from one decode to the next, so that the allocator does not hand it back to the
// system and fault it in again. A decode takes the smallest kept block that fits (or a new one) and gives it back
// when its cache goes; at most kKept blocks of at most kMaxFloats are kept. Decodes may run at once (the GIL is
// released), so the list is locked.
class Workspace {
 public:
  static constexpr size_t kKept = 2;
  static constexpr int64_t kMaxFloats = int64_t{64} << 20;  // 256 MB

  // A block of at least `floats` floats, returned to the workspace when the last holder lets go.
  std::shared_ptr<Tensor> take(int64_t floats, const at::TensorOptions& options) {
    Tensor block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = blocks_.end();
      for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
        if (it->numel() >= floats && (best == blocks_.end() || it->numel() < best->numel())) best = it;
      if (best != blocks_.end()) {
        block = *best;
        blocks_.erase(best);
      }
    }
    if (!block.defined()) block = at::empty({floats}, options);
    return std::shared_ptr<Tensor>(new Tensor(block), [this](Tensor* held) {
      give_back(*held);
      delete held;
    });
  }

 private:
  void give_back(const Tensor& block) {
    if (block.numel() > kMaxFloats) return;
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.push_back(block);
    if (blocks_.size() > kKept) {  // keep the largest
      auto smallest = std::min_element(blocks_.begin(), blocks_.end(),
                                       [](const Tensor& a, const Tensor& b) { return a.numel() < b.numel(); });
      blocks_.erase(smallest);
    }
  }

  std::mutex mutex_;
  std::vector<Tensor> blocks_;
};


}  // namespace
