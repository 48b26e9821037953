// Memory for the kernels' output tensors, kept for reuse: a model's forward asks for the same
// block sizes in the same order on every call, so a block freed by one call serves the next.
// glibc's malloc searched its bins for each large block: on BERT-large (1 x 256, AMX Xeon, 2
// threads) _int_malloc under at::empty took ~2% of the forward's time, ~10 us per output
// tensor. With the pool, whole models (in-process A/B, interleaved rounds, outputs
// bit-identical) took 0.94x the time on BERT-large 1 x 256, 0.97x on distilbert 1 x 256,
// 0.95x on the real MiniLM 1 x 128 (8 x 128: 1.005x, noise). The kernels' small per-call
// scratch stays with malloc (its thread caches serve it well; through the pool's lock it was
// 1.02x slower on MiniLM 8 x 128).
//
// Blocks are grouped by size class (64-byte steps up to 4 KB, 4 KB steps above); a freed block
// goes back to its class's list unless the pool already holds kCachedLimit bytes, or the block
// is larger than kLargestCached (a block that large costs far more to fill than to allocate).
// Every block starts on a cache line. The pool is never destroyed (tensors may be freed during
// static destruction at exit).

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>

#include "internal.h"

#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace squant_kernels {
namespace {

constexpr std::size_t kCachedLimit = std::size_t(256) << 20;  // free bytes kept, at most
constexpr std::size_t kLargestCached = std::size_t(64) << 20;

std::size_t size_class(std::size_t bytes) {
  const std::size_t step = bytes <= 4096 ? kCacheLine : 4096;
  return std::max<std::size_t>(step, (bytes + step - 1) / step * step);
}

class BlockPool {
 public:
  void* take(std::size_t bytes) {
    const std::size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
        return p;
      }
    }
    return ::operator new(cls, std::align_val_t(kCacheLine));
  }

  void give(void* p, std::size_t bytes) {
    if (p == nullptr) return;
    const std::size_t cls = size_class(bytes);
    if (cls <= kLargestCached) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + cls <= kCachedLimit) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    ::operator delete(p, std::align_val_t(kCacheLine));
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
};

BlockPool& pool() {
  static BlockPool* p = new BlockPool();
  return *p;
}

// A tensor's block keeps its size in front of the data: the deleter gets only a pointer.
constexpr std::size_t kHeader = kCacheLine;

void delete_block(void* ctx) {
  std::size_t bytes;
  std::memcpy(&bytes, ctx, sizeof(bytes));
  pool().give(ctx, bytes);
}

struct PoolAllocator final : c10::Allocator {
  c10::DataPtr allocate(std::size_t n) override {
    const std::size_t bytes = n + kHeader;
    auto* block = static_cast<char*>(pool().take(bytes));
    std::memcpy(block, &bytes, sizeof(bytes));
    return {block + kHeader, block, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PoolAllocator& pool_allocator() {
  static PoolAllocator* a = new PoolAllocator();
  return *a;
}

}  // namespace

at::Tensor pooled_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::detail::empty_generic(sizes, &pool_allocator(),
                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), std::nullopt);
}

}  // namespace squant_kernels
