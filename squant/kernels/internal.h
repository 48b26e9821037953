// What one of squant's kernel files offers another (they are built into one library).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <new>
#include <string>
#include <vector>

namespace squant_kernels {

// int8_linear.cpp: an int8 linear with float32 output, checked once; the returned function
// writes output rows [m0, m0 + rows), columns [c0, c1) to out (row stride ld, column c0 at
// out[0]), from any thread; c0 is a multiple of 64, and c1 too or out_features. A thread that
// called it calls linear_rows_release() when its share is done (the GEMM's tile state, as
// at::native::cpublas::brgemm_release).
constexpr int64_t kLinearBlockN = 64;
using LinearRows = std::function<void(int64_t m0, int64_t rows, int64_t c0, int64_t c1,
                                      float* out, int64_t ld)>;
LinearRows int8_linear_rows(const at::Tensor& x, const at::Tensor& packed_weight,
                            const at::Tensor& compensation, double x_scale, int64_t x_zero_point,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            int64_t out_features, const std::optional<at::Tensor>& row_scale,
                            const std::optional<at::Tensor>& side_x,
                            const std::optional<at::Tensor>& side_w);
void linear_rows_release();

// int8_linear.cpp: whether this CPU has the AVX512 subsets the vector paths use (F, BW, VL, DQ).
bool cpu_has_avx512();

// The target of those vector paths' functions (the files build on any x86-64 compiler; a
// path runs only where cpu_has_avx512() says so).
#define SQ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

// The lanes of a 16-float vector that hold data when `remaining` values are left.
inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1);
}

// int8_linear.cpp: quantize_per_token's arithmetic on one row x[0, K) (times mult when given):
// its scale (|max| / 127) to *scale and its u8 values (zero point 128) to q; `vector` picks
// the AVX512 path, which gives the same integers.
void quantize_token_row(bool vector, const float* x, const float* mult, int64_t K, float* scale,
                        uint8_t* q);

// int8_linear.cpp: a per-token quantize's optional operands, checked for K features (undefined
// tensors where absent): the multiplier (float32 [K]) and the outlier channels' indices.
at::Tensor checked_multiplier(const std::optional<at::Tensor>& multiplier, int64_t K,
                              const char* op);
at::Tensor checked_side_index(const std::optional<at::Tensor>& side_index, int64_t width,
                              const char* op, const char* what);

// at::empty for the kernels' output tensors (contiguous, CPU, uninitialized), from squant's
// pool of freed blocks (memory_pool.cpp).
at::Tensor pooled_empty(at::IntArrayRef sizes, const at::TensorOptions& options);

// Tasks [0, tasks) over the OpenMP team: worker(claim) runs once per thread and loops `for (t =
// claim(); t < tasks; t = claim())`, keeping its scratch across its tasks. Each thread owns a
// contiguous range (as a static split would give it) and claims its tasks front to back, so
// tasks that share data in order (a GEMM's row blocks of one weight block) stay on one core;
// a thread whose range is done takes tasks from the back of the others' ranges. Cores do not
// run equal work in equal time here (caches warm for one and cold for the other, a
// neighbour's load): with a static split one of two threads waited at the end for ~10% of an
// int8 GEMM and of a Q|K|V + attention call inside BERT-large 1 x 256 (AMX Xeon, 2 threads).
// Measured there, the waiting fell from 44 to 11 thread-us per GEMM call (of 460 us) and from
// 105 to 41 per attention call (with the finer attention tasks, see head_groups).
namespace detail {
// A range [front, back) in one word, front in the low 32 bits: claims from either end are one
// compare-and-swap each, and the two ends never pass each other.
inline uint64_t pack_range(uint64_t front, uint64_t back) { return front | (back << 32); }

// The range's first (from_back = false) or last task, taken; -1 where it is empty.
inline int64_t take_task(std::atomic<uint64_t>& range, bool from_back) {
  uint64_t v = range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t front = v & 0xffffffffu, back = v >> 32;
    if (front >= back) return -1;
    const uint64_t next = from_back ? pack_range(front, back - 1) : pack_range(front + 1, back);
    if (range.compare_exchange_weak(v, next, std::memory_order_relaxed))
      return int64_t(from_back ? back - 1 : front);
  }
}
}  // namespace detail

template <typename Worker>
void run_claimed(int64_t tasks, Worker&& worker) {
  TORCH_CHECK(tasks < (int64_t(1) << 32), "squant: too many tasks for one call (", tasks, ")");
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks);
  if (threads <= 0) return;
  std::vector<std::atomic<uint64_t>> ranges(threads);
  for (int64_t r = 0; r < threads; ++r)
    ranges[r].store(detail::pack_range(tasks * r / threads, tasks * (r + 1) / threads));
  // a thread given several ranges (a smaller team, or a call inside a parallel region, which
  // runs inline) owns them all
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    int64_t own = begin;
    auto claim = [&]() -> int64_t {
      for (; own < end; ++own)
        if (const int64_t t = detail::take_task(ranges[own], false); t >= 0) return t;
      for (int64_t i = 0; i < threads; ++i)
        if (const int64_t t = detail::take_task(ranges[(end + i) % threads], true); t >= 0) return t;
      return tasks;
    };
    worker(claim);
  });
}

// Scratch memory on cache-line (64-byte) boundaries. malloc promises 16 bytes, and the
// attention kernels' buffers (packed keys, quantized queries, scores, probability and value
// digits) came out 16, 32 or 48 bytes into a line: each 64-byte tile row or vector load then
// spanned two lines. Inside whole models on an AMX Xeon (2 threads, in-process A/B, outputs
// bit-identical) that layout took 1.086x the time of aligned buffers on distilbert 1 x 256 and
// 1.106x on BERT-large; every buffer 16 bytes off, 1.19x on distilbert.
constexpr std::size_t kCacheLine = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kCacheLine)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kCacheLine)); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const {
    return false;
  }
};

// A std::vector whose elements start on a cache line.
template <typename T>
using LineVector = std::vector<T, CacheLineAllocator<T>>;

// `count` uninitialized elements starting on a cache line, freed with the object.
template <typename T>
class LineBuffer {
 public:
  explicit LineBuffer(std::size_t count)
      : count_(count), p_(CacheLineAllocator<T>().allocate(count)) {}
  ~LineBuffer() { CacheLineAllocator<T>().deallocate(p_, count_); }
  LineBuffer(const LineBuffer&) = delete;
  LineBuffer& operator=(const LineBuffer&) = delete;
  T* get() const { return p_; }

 private:
  std::size_t count_;
  T* p_;
};

}  // namespace squant_kernels
