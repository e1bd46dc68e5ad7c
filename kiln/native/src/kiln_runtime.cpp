// kiln's runtime over libtorch: the functions of kiln_runtime.h. Built once per machine and torch
// version (kiln/native/libkiln.py) and loaded before any graph library whose wrapper calls it.
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/add.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_permuted.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/hardswish.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tanh.h>
#include <torch/library.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <vector>

// kiln's own GEMM, a unit of this library (kiln/native/kernels_unit.py `source`); the epilogue
// field by field as kiln_gemm::Epilogue.
struct KilnGemmEpilogue {
  const void* bias;
  const void* residual;
  int64_t ld_residual;
  int32_t bias_bf16, residual_bf16, out_bf16;
  int32_t unary;
  float scalar0, scalar1;
  int32_t residual_before_unary;
  int32_t row_norm;
  float norm_eps;
  const float* norm_weight;
  const float* norm_bias;
  void* norm_out;
  int64_t ld_norm_out;
  int32_t norm_out_bf16;
  void* sum_out;
  int64_t ld_sum_out;
  int64_t gated_width;
};
extern "C" int64_t kiln_gemm_packed_elements_f32(int64_t K, int64_t N);
extern "C" int64_t kiln_gemm_packed_elements_bf16(int64_t K, int64_t N);
extern "C" void kiln_gemm_pack_f32(const void* b, int64_t K, int64_t N, int64_t sk, int64_t sn, void* out);
extern "C" void kiln_gemm_pack_bf16(const void* b, int64_t K, int64_t N, int64_t sk, int64_t sn, void* out);
extern "C" void kiln_gemm_f32(int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const void* bp, void* c,
                              int64_t ldc, const KilnGemmEpilogue* e, int64_t kc);
extern "C" void kiln_gemm_bf16(int64_t M, int64_t N, int64_t K, const void* a, int64_t lda, const void* bp, void* c,
                               int64_t ldc, const KilnGemmEpilogue* e, int64_t kc);
extern "C" void kiln_gemm_convert_a_bf16(int64_t M, int64_t K, const void* a, int64_t lda, void* out);
// Its weight-only quantized form (kiln_gemm_quant.h), in the same unit.
extern "C" int64_t kiln_gemm_quant_packed_bytes(int32_t bits, int64_t K, int64_t N, int64_t group);
extern "C" int64_t kiln_gemm_panel_columns();
extern "C" void kiln_gemm_quant_pack(int32_t bits, int64_t K, int64_t N, int64_t group, const uint8_t* q,
                                     const float* scales, const float* zeros, uint8_t* out);
extern "C" void kiln_gemm_quant_f32(int32_t bits, int64_t M, int64_t N, int64_t K, int64_t group, const float* a,
                                    int64_t lda, const uint8_t* packed, void* c, int64_t ldc,
                                    const KilnGemmEpilogue* e, int64_t kc);
extern "C" void kiln_gemm_quant_bf16_math(int32_t bits, int64_t M, int64_t N, int64_t K, int64_t group,
                                          const float* a, int64_t lda, const uint8_t* packed, void* c, int64_t ldc,
                                          const KilnGemmEpilogue* e, int64_t kc);
extern "C" void kiln_gemm_quant_bf16_rows(int32_t bits, int64_t M, int64_t N, int64_t K, int64_t group,
                                          const void* a, int64_t lda, const uint8_t* packed, void* c, int64_t ldc,
                                          const KilnGemmEpilogue* e, int64_t kc);
extern "C" void kiln_gemm_quant_a8_f32(int32_t integer, int64_t M, int64_t N, int64_t K, int64_t group, const float* a,
                                       int64_t lda, const uint8_t* packed, void* c, int64_t ldc,
                                       const KilnGemmEpilogue* e, int64_t kc);
// kiln's depthwise convolution, in the same unit (kiln/externs/kiln_depthwise.py).
extern "C" void kiln_depthwise_pack_f32(const float* w, int64_t C, int64_t taps, float* out);
extern "C" void kiln_depthwise_f32(const int64_t* shape, const float* x, const float* wp, const float* bias,
                                   const float* other, float* y, const KilnGemmEpilogue* e);
// kiln's attention, in the same unit (kiln::attention below): `shape` as
// kiln_attention::Shape, 21 values; `mask` may be NULL.
extern "C" void kiln_attention_f32(const int64_t* shape, const float* q, const float* k, const float* v,
                                   const float* mask, float* out, float scale, int32_t causal);
// The float32 lanes of the unit's vectors (v's head size must be a multiple of them).
extern "C" int kiln_vec_lanes();
// kiln's GEMM's K blocking (kiln/native/kernels_unit.py K_BLOCK).
extern "C" int64_t kiln_gemm_k_block();
extern "C" void kiln_gemm_set_huge_page_packs(int32_t on);
extern "C" int32_t kiln_gemm_huge_page_packs(void);
extern "C" void kiln_gemm_set_near_gemv(int32_t on);

namespace {

thread_local std::string last_error;

at::Tensor& tensor_of(kiln_tensor t) { return *static_cast<at::Tensor*>(t); }

// Handles' memory: each thread keeps the blocks of the handles released on it for its next ones.
// A decode step's call makes and releases ~900 handles (its ~560 inputs', its operators' results),
// each a malloc and a free of 8 bytes: past the 7 blocks of a size glibc's thread cache holds, they
// went to its fastbins, which the next request of 1 KB or more (anywhere in the process) first
// consolidates, a chunk at a time. Every handle is a block of operator new (torch's handles too),
// so one made here may be deleted elsewhere and the other way round.
constexpr size_t kKeptHandles = 4096;

struct FreeHandles {
  std::vector<void*> blocks;
  ~FreeHandles() {
    for (void* block : blocks) ::operator delete(block);
  }
};
thread_local FreeHandles free_handles;

kiln_tensor new_handle(at::Tensor t) {
  std::vector<void*>& blocks = free_handles.blocks;
  void* block;
  if (blocks.empty()) {
    block = ::operator new(sizeof(at::Tensor));
  } else {
    block = blocks.back();
    blocks.pop_back();
  }
  return new (block) at::Tensor(std::move(t));
}

void release_handle(kiln_tensor t) {
  if (t == nullptr) return;  // (as `delete` of a null pointer: an operator's None result)
  auto* tensor = static_cast<at::Tensor*>(t);
  tensor->~Tensor();
  std::vector<void*>& blocks = free_handles.blocks;
  if (blocks.size() < kKeptHandles) {
    if (blocks.capacity() == 0) blocks.reserve(kKeptHandles);
    blocks.push_back(tensor);
  } else {
    ::operator delete(tensor);
  }
}

// An argument as the IValue the operator's schema asks for: list element types and optional
// elements come from the schema's type, so a typed list (Tensor?[], Scalar?[], int[]) unboxes.
c10::IValue to_ivalue(const kiln_arg& a, const c10::TypePtr& type) {
  c10::TypePtr element = type;
  if (auto optional = element->cast<c10::OptionalType>()) element = optional->getElementType();
  if (element->kind() == c10::TypeKind::TensorType && (a.kind == KILN_INT || a.kind == KILN_DOUBLE || a.kind == KILN_BOOL)) {
    // A number where the schema has a Tensor (`mul.Tensor(x, 2)`): a 0-dim tensor marked as a
    // wrapped number, as torch's Python argument parser makes it, so type promotion treats it as
    // the scalar it is.
    at::Tensor t = a.kind == KILN_INT ? at::scalar_tensor(a.i, at::kLong)
                   : a.kind == KILN_DOUBLE ? at::scalar_tensor(a.d, at::kDouble) : at::scalar_tensor(a.i != 0, at::kBool);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return c10::IValue(t);
  }
  switch (a.kind) {
    case KILN_NONE: return c10::IValue();
    case KILN_TENSOR: return c10::IValue(tensor_of(const_cast<void*>(a.p)));
    case KILN_INT: return c10::IValue(a.i);
    case KILN_DOUBLE: return c10::IValue(a.d);
    case KILN_BOOL: return c10::IValue(a.i != 0);
    case KILN_STRING: return c10::IValue(std::string(static_cast<const char*>(a.p)));
    case KILN_DTYPE: return c10::IValue(static_cast<c10::ScalarType>(a.i));
    case KILN_LAYOUT: return c10::IValue(static_cast<c10::Layout>(a.i));
    case KILN_MEMORY_FORMAT: return c10::IValue(static_cast<c10::MemoryFormat>(a.i));
    case KILN_DEVICE: return c10::IValue(c10::Device(static_cast<c10::DeviceType>(a.i), static_cast<c10::DeviceIndex>(a.n)));
    case KILN_LIST: {
      c10::TypePtr list_type = type;
      if (auto optional = list_type->cast<c10::OptionalType>()) list_type = optional->getElementType();
      auto as_list = list_type->cast<c10::ListType>();
      TORCH_CHECK(as_list, "kiln runtime: a list argument where the schema has ", type->str());
      c10::TypePtr element = as_list->getElementType();
      const kiln_arg* items = static_cast<const kiln_arg*>(a.p);
      if (element->kind() == c10::TypeKind::IntType) {
        std::vector<int64_t> values(a.n);
        for (int64_t k = 0; k < a.n; ++k) values[k] = items[k].i;
        return c10::IValue(values);
      }
      if (element->kind() == c10::TypeKind::FloatType) {
        std::vector<double> values(a.n);
        for (int64_t k = 0; k < a.n; ++k) values[k] = items[k].d;
        return c10::IValue(values);
      }
      if (element->kind() == c10::TypeKind::BoolType) {
        c10::List<bool> values;
        for (int64_t k = 0; k < a.n; ++k) values.push_back(items[k].i != 0);
        return c10::IValue(values);
      }
      if (element->kind() == c10::TypeKind::TensorType) {
        std::vector<at::Tensor> values;
        for (int64_t k = 0; k < a.n; ++k) values.push_back(tensor_of(const_cast<void*>(items[k].p)));
        return c10::IValue(values);
      }
      c10::impl::GenericList values(element);
      for (int64_t k = 0; k < a.n; ++k) values.push_back(to_ivalue(items[k], element));
      return c10::IValue(values);
    }
  }
  TORCH_CHECK(false, "kiln runtime: unknown argument kind ", a.kind);
}

void flatten(const c10::IValue& v, std::vector<kiln_tensor>& out) {
  if (v.isTensor()) {
    out.push_back(new_handle(v.toTensor()));
  } else if (v.isNone()) {
    out.push_back(nullptr);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(new_handle(t));
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) flatten(e, out);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) flatten(e, out);
  } else {
    TORCH_CHECK(false, "kiln runtime: an operator result that is not a tensor: ", v.tagKind());
  }
}

template <typename F>
int guarded(F&& body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    // (its message without libtorch's C++ backtrace, as torch's Python bindings show it)
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}

// ---- kiln's buffers ------------------------------------------------------------------------------
//
// The tensors the runtime makes (its operators' outputs, a C++ wrapper's buffers) take their memory
// from freed blocks of the same size class kept for them, of up to kLargestBuffer bytes and
// `limit` bytes in all (kiln_set_buffer_cache, the setting runtime.buffer_cache_mb), else from
// c10's CPU allocator. A decode step makes ~150 such tensors of a few kilobytes: from glibc each
// costs an aligned malloc, which consolidates the small chunks freed since first, and a free
// (0.958x the time a token with the blocks kept, on a 24-layer twin whose step is all host work);
// here a lock and a list. Only kiln's own tensors: the
// process's allocator and everything else it allocates are left as they are. A block's first 64
// bytes hold its size class (the data stays 64-byte aligned).
char* map_huge(size_t size);  // (below, with the packs' memory)
extern std::atomic<bool> huge_pages_on;

namespace buffer_cache {

constexpr size_t kHeader = 64, kLargestBuffer = size_t(1) << 20;

// New blocks are carved from an arena of 2 MB pages (map_huge), as kiln's packs are, where
// backend.huge_pages is on: a decode step's ~150 buffers and the operators' outputs then lie on a
// page or two, where from glibc's heap they lay on as many 4 KB pages, each a TLB miss walking page
// tables the step's streamed weights had evicted. Qwen2-0.5B int4's decode graph on 2 threads of an
// Intel Xeon with AMX (family 6 model 167), processes alternated: 8.79-9.15 ms a call before and
// 8.27-8.55 after in a first series of three (llama-160m int4's 1.53-1.73 -> 1.49-1.54), the median
// round 0.99x in a later one of six, within noise where the memory was fast: a gain of a few
// percent at most, where page walks cost the most (docs/native.md). The arena is address space
// until touched (kArenaBytes, the cache's default limit, carved in order): a block of it freed past
// the limit cannot go back to the system alone and is kept apart for the arena's next use
// (`spare`), so the arena's memory is at most what was carved.
constexpr size_t kArenaBytes = size_t(32) << 20;
struct Arena {
  char* base = nullptr;  // (nullptr: not mapped yet, or refused)
  size_t used = 0;
  bool refused = false;
  std::map<size_t, std::vector<void*>> spare;  // its freed blocks the cache did not keep, by size class
};

struct State {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free_blocks;  // by size class
  size_t kept = 0;                                   // bytes in free_blocks
  Arena arena;
};
State& state() {
  static State* s = new State;  // (never destroyed: tensors may be freed during the process's exit)
  return *s;
}
std::atomic<size_t> limit{size_t(32) << 20};

// Multiples of 64 bytes up to 4 KB, then eight classes per power of two (at most 1/8 unused).
size_t size_class(size_t n) {
  if (n <= 4096) return std::max<size_t>(64, (n + 63) & ~size_t(63));
  const size_t step = (size_t(1) << (63 - __builtin_clzll(n))) / 8;
  return (n + step - 1) / step * step;
}

bool in_arena(const State& s, const void* base) {
  return s.arena.base && base >= s.arena.base && base < s.arena.base + kArenaBytes;
}

// A free block of size class `size` from the list `lists` keeps for it, or nullptr.
void* take(std::map<size_t, std::vector<void*>>& lists, size_t size) {
  auto found = lists.find(size);
  if (found == lists.end() || found->second.empty()) return nullptr;
  void* base = found->second.back();
  found->second.pop_back();
  return base;
}

// A block of size class `size` from the arena (a spare one, else carved), or nullptr where it is
// full, refused or off. Under the lock.
void* from_arena(State& s, size_t size) {
  if (void* spare = take(s.arena.spare, size)) return spare;
  if (!huge_pages_on.load(std::memory_order_relaxed) || s.arena.refused) return nullptr;
  if (!s.arena.base && !(s.arena.base = map_huge(kArenaBytes))) {
    s.arena.refused = true;
    return nullptr;
  }
  if (s.arena.used + size + kHeader > kArenaBytes) return nullptr;
  char* base = s.arena.base + s.arena.used;
  s.arena.used += size + kHeader;
  *reinterpret_cast<size_t*>(base) = size;
  return base;
}

void release(void* base) {
  const size_t size = *static_cast<size_t*>(base);
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.kept + size <= limit.load(std::memory_order_relaxed)) {
      s.free_blocks[size].push_back(base);
      s.kept += size;
      return;
    }
    if (in_arena(s, base)) {
      s.arena.spare[size].push_back(base);
      return;
    }
  }
  c10::free_cpu(base);
}

void drop_all() {
  State& s = state();
  std::vector<void*> freed;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto& [size, blocks] : s.free_blocks)
      for (void* base : blocks) {
        if (in_arena(s, base)) s.arena.spare[size].push_back(base);
        else freed.push_back(base);
      }
    s.free_blocks.clear();
    s.kept = 0;
  }
  for (void* base : freed) c10::free_cpu(base);
}

struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0 || n > kLargestBuffer || limit.load(std::memory_order_relaxed) == 0)
      return c10::GetCPUAllocator()->allocate(n);
    const size_t size = size_class(n);
    void* base = nullptr;
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mutex);
      if ((base = take(s.free_blocks, size)) != nullptr) s.kept -= size;
      else base = from_arena(s, size);
    }
    if (base == nullptr) {
      base = c10::alloc_cpu(size + kHeader);
      *static_cast<size_t*>(base) = size;
    }
    return {static_cast<char*>(base) + kHeader, base, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};
Allocator allocator;

}  // namespace buffer_cache

// A CPU tensor of the runtime's own (its memory from buffer_cache).
at::Tensor buffer(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::detail::empty_generic(sizes, &buffer_cache::allocator, c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                   std::nullopt);
}

at::Tensor strided_buffer(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype) {
  return at::detail::empty_strided_generic(sizes, strides, &buffer_cache::allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
}

// ---- packed weights' memory ----------------------------------------------------------------------
//
// A decode step streams every packed weight from DRAM once, and on 4 KB pages each 4 KB of it is a
// TLB miss (under a VM's nested paging a miss walks two page tables), and a stream's hardware
// prefetches stop at each page. Read with AVX-512 by 2 threads of a 2-core AMD EPYC VM (Zen 4), 76 MB
// streamed at 35-36 GB/s from 4 KB pages and 65 GB/s from 2 MB ones (C, 20 rounds, 2026-12-01). So
// kiln's own packs (its GEMM's panels, its quantized panels) are carved from chunks of anonymous
// memory aligned to 2 MB and advised as transparent huge pages (madvise MADV_HUGEPAGE: the kernel
// backs them with 2 MB pages where /sys/kernel/mm/transparent_hugepage/enabled is `always` or
// `madvise`, and with 4 KB pages as before where it is `never`). Only kiln's packs: PyTorch's
// allocator, the user's tensors and the process are left as they are. A chunk is address space
// until touched, so its unused tail costs no memory; a 2 MB page goes back to the system as soon as
// no pack lies on it, and the chunk when its last pack is freed (docs/gemm.md). The setting backend.huge_pages (kiln_set_huge_pages) turns it off: packs then come
// from PyTorch's allocator.
std::atomic<bool> huge_pages_on{true};

struct PackChunk {
  char* base;
  size_t size, used = 0;
  int64_t live = 0;               // packs carved from it and not yet freed
  std::vector<int32_t> on_page;   // of those, how many lie on each of its 2 MB pages
};
std::mutex chunks_mutex;
PackChunk* open_chunk = nullptr;  // where the next pack is carved (nullptr: none yet)
constexpr size_t HUGE_PAGE = size_t(2) << 20, CHUNK_BYTES = size_t(64) << 20, PACK_ALIGN = 64;

// The chunk's 2 MB pages [first, last] that a pack at `at`, `bytes` long, lies on.
void pages_of(const PackChunk* chunk, const char* at, size_t bytes, size_t& first, size_t& last) {
  first = size_t(at - chunk->base) / HUGE_PAGE;
  last = (size_t(at - chunk->base) + bytes - 1) / HUGE_PAGE;
}

// A pack at `at`, `need` bytes carved, freed. Each 2 MB page no pack lies on any more goes back to
// the system at once (MADV_DONTNEED): a chunk is carved in order and never reuses a freed pack's
// place while others live in it, and the autotuner's trial weights (packed, timed, freed) would
// otherwise hold their memory for as long as any real pack beside them. Whole 2 MB pages only:
// returning the 4 KB pages of a huge page's part splits it, and khugepaged later collapses it again,
// all 2 MB resident, at a moment nothing of kiln's runs (a soak test's resident memory grew 2.4 MB
// in 2,000 calls that packed nothing). Under the lock: a page given back is one nothing is being
// carved on.
void release_pack(PackChunk* chunk, char* at, size_t need) {
  std::lock_guard<std::mutex> lock(chunks_mutex);
  size_t first, last;
  pages_of(chunk, at, need, first, last);
  for (size_t page = first; page <= last; ++page)
    if (--chunk->on_page[page] == 0) madvise(chunk->base + page * HUGE_PAGE, HUGE_PAGE, MADV_DONTNEED);
  if (--chunk->live > 0) return;
  if (chunk == open_chunk) {
    chunk->used = 0;  // the open chunk is carved from its start again
    return;
  }
  munmap(chunk->base, chunk->size);
  delete chunk;
}

// An anonymous mapping of `size` bytes (a multiple of 2 MB) at a 2 MB boundary, advised as huge
// pages, or nullptr where the system refuses it.
char* map_huge(size_t size) {
  void* raw = mmap(nullptr, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* start = static_cast<char*>(raw);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
  if (base > start) munmap(start, base - start);
  if (base + size < start + size + HUGE_PAGE) munmap(base + size, start + size + HUGE_PAGE - (base + size));
  madvise(base, size, MADV_HUGEPAGE);  // (refused where the kernel has no THP: 4 KB pages, as before)
  return base;
}

// Whether the kernel backs advised memory with 2 MB pages (transparent_hugepage `always` or `madvise`).
bool transparent_huge_pages() {
  static const bool on = [] {
    FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char text[128] = {};
    const size_t n = std::fread(text, 1, sizeof text - 1, f);
    std::fclose(f);
    const std::string mode(text, n);
    return mode.find("[always]") != std::string::npos || mode.find("[madvise]") != std::string::npos;
  }();
  return on;
}

// An empty 1-d tensor of `numel` elements for a pack: carved from a huge-page chunk, or PyTorch's
// allocator's where the setting is off, the pack is under a page, or the mapping fails.
at::Tensor pack_empty(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes = size_t(numel) * options.dtype().itemsize();
  if (!huge_pages_on.load(std::memory_order_relaxed) || bytes < 4096) return at::empty({numel}, options);
  const size_t need = (bytes + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;
  PackChunk* chunk;
  char* at;
  {
    std::lock_guard<std::mutex> lock(chunks_mutex);
    if (!open_chunk || open_chunk->used + need > open_chunk->size) {
      const size_t size = std::max(CHUNK_BYTES, (need + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
      char* base = map_huge(size);
      if (!base) return at::empty({numel}, options);
      if (open_chunk && open_chunk->live == 0) {  // (a chunk nothing lives in any more)
        munmap(open_chunk->base, open_chunk->size);
        delete open_chunk;
      }
      open_chunk = new PackChunk{base, size, 0, 0, std::vector<int32_t>(size / HUGE_PAGE, 0)};
    }
    chunk = open_chunk;
    at = chunk->base + chunk->used;
    chunk->used += need;
    ++chunk->live;
    size_t first, last;
    pages_of(chunk, at, need, first, last);
    for (size_t page = first; page <= last; ++page) ++chunk->on_page[page];
  }
  return at::from_blob(at, {numel}, [chunk, at, need](void*) { release_pack(chunk, at, need); }, options);
}

// ---- kiln::mm ----------------------------------------------------------------------------------

// Packed forms of weights, per weight, kind and version (prepacked.py `packed` keeps them on the
// Python tensor object; here a weak reference tells a weight still alive from a new one at the
// same address).
struct Pack {
  c10::weak_intrusive_ptr<c10::TensorImpl> weight;
  uint32_t version;
  at::Tensor packed;
};
using PackKey = std::pair<const c10::TensorImpl*, std::string>;  // (the weight, the kind of pack)
struct PackKeyHash {
  size_t operator()(const PackKey& key) const {
    return std::hash<const void*>()(key.first) * 31 + std::hash<std::string>()(key.second);
  }
};
std::mutex packs_mutex;
// (Hashed: a decode step asks ~100 times, each a tree walk through ~200 packs before, ~3 % of a
// 24-layer step's host time with the string compares.)
std::unordered_map<PackKey, Pack, PackKeyHash> packs;

template <typename Make>
at::Tensor packed(const at::Tensor& weight, const std::string& kind, Make&& make) {
  std::lock_guard<std::mutex> lock(packs_mutex);
  auto key = std::make_pair(weight.unsafeGetTensorImpl(), kind);
  auto found = packs.find(key);
  if (found != packs.end() && !found->second.weight.expired() &&
      found->second.weight._unsafe_get_target() == weight.unsafeGetTensorImpl() &&
      found->second.version == weight._version()) {
    return found->second.packed;
  }
  // Packs of weights freed since (a re-frozen model's old constants) go now: packing is rare, and
  // a pack kept past its weight would hold the weight's size in memory for nothing.
  for (auto it = packs.begin(); it != packs.end();) it = it->second.weight.expired() ? packs.erase(it) : std::next(it);
  at::NoGradGuard no_grad;
  at::Tensor made = make();
  if (made.unsafeGetTensorImpl() == weight.unsafeGetTensorImpl()) {
    return made;  // the weight itself (already contiguous): kept, it would never be freed
  }
  packs.insert_or_assign(key, Pack{c10::weak_intrusive_ptr<c10::TensorImpl>(weight.getIntrusivePtr()), weight._version(), made});
  return made;
}

c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

double scalar_value(const kiln_arg& a) { return a.kind == KILN_DOUBLE ? a.d : static_cast<double>(a.i); }

// A post-op's scalars (leaky_relu's slope, hardtanh's bounds), as the schemas' `Scalar?[]`.
using Scalars = c10::List<std::optional<at::Scalar>>;

double scalar_at(const Scalars& scalars, size_t k) {
  std::optional<at::Scalar> s = scalars.get(k);
  TORCH_CHECK(s.has_value(), "kiln: a post-op scalar is None");
  return s->toDouble();
}

// An operator called with its arguments boxed: for the oneDNN operators, whose schemas mix
// optional strings, scalars and lists, this is simpler than spelling their C++ types.
at::Tensor call_boxed(const c10::OperatorHandle& op, std::vector<c10::IValue> args) {
  torch::jit::Stack stack(std::move(args));
  op.callBoxed(stack);
  return stack.at(0).toTensor();
}

at::Tensor unary_aten(const at::Tensor& y, c10::string_view unary, const Scalars& scalars,
                      c10::string_view algorithm) {
  if (unary == "none") return y;
  if (unary == "relu") return at::relu(y);
  if (unary == "sigmoid") return at::sigmoid(y);
  if (unary == "tanh") return at::tanh(y);
  if (unary == "swish") return at::silu(y);
  if (unary == "hardswish") return at::hardswish(y);
  if (unary == "gelu") return at::gelu(y, algorithm.empty() ? "none" : algorithm);
  if (unary == "leaky_relu") return at::leaky_relu(y, scalar_at(scalars, 0));
  if (unary == "hardtanh") return at::clamp(y, scalar_at(scalars, 0), scalar_at(scalars, 1));
  TORCH_CHECK(false, "kiln::mm: unknown post-op ", unary);
}

int32_t gemm_unary_code(c10::string_view unary, c10::string_view algorithm) {
  // kiln_gemm::Unary (kiln_gemm.h), by post-op name.
  static const std::map<std::string, int32_t> codes = {
      {"none", 0}, {"relu", 1}, {"gelu", 2}, {"gelu_tanh", 3}, {"swish", 4}, {"sigmoid", 5},
      {"tanh", 6}, {"hardswish", 7}, {"leaky_relu", 8}, {"hardtanh", 9}};
  auto found = codes.find(unary == "gelu" && algorithm == "tanh" ? std::string("gelu_tanh") : std::string(unary));
  TORCH_CHECK(found != codes.end(), "kiln::mm: kiln's GEMM has no post-op ", unary);
  return found->second;
}

// An epilogue of the unary op alone (its scalars: leaky_relu's slope, hardtanh's bounds).
KilnGemmEpilogue unary_epilogue(c10::string_view unary, c10::string_view algorithm, const Scalars& scalars) {
  KilnGemmEpilogue e{nullptr, nullptr, 0, 0, 0, 0, gemm_unary_code(unary, algorithm), 0.0f, 0.0f, 0};
  if (scalars.size() > 0) e.scalar0 = static_cast<float>(scalar_at(scalars, 0));
  if (scalars.size() > 1) e.scalar1 = static_cast<float>(scalar_at(scalars, 1));
  return e;
}

// kiln's GEMM's panels of a frozen weight, packed once per weight: `as_b()` is the weight as B
// [K, N] (any strides: the weight itself, or a 1x1 convolution's [K, C] viewed as [C, K]), made
// only when the pack is. `bf16_math`: a float32 weight's panels rounded to bfloat16, for bfloat16
// fast math (impl "kiln_bf16"), a kind of their own beside any float32 panels of the same weight.
template <typename AsB>
at::Tensor kiln_panels(const at::Tensor& weight, AsB&& as_b, bool bf16_math = false) {
  return packed(weight, bf16_math ? "kiln_bf16" : "kiln", [&] {
    at::Tensor b = as_b();
    if (bf16_math) b = b.to(at::kBFloat16);  // (rounded to nearest even, as A is)
    const bool bf16 = b.scalar_type() == at::kBFloat16;
    const int64_t K = b.size(0), N = b.size(1);
    at::Tensor out = pack_empty(bf16 ? kiln_gemm_packed_elements_bf16(K, N) : kiln_gemm_packed_elements_f32(K, N),
                                b.options());
    (bf16 ? kiln_gemm_pack_bf16 : kiln_gemm_pack_f32)(b.data_ptr(), K, N, b.stride(0), b.stride(1), out.data_ptr());
    return out;
  });
}

// kiln's own GEMM's two implementations of kiln::mm and its row norms: "kiln" in the operands'
// dtype, "kiln_bf16" a float32 product in bfloat16 fast math (backend.fp32_gemm = bf16): whether
// `impl` is the latter.
bool kiln_bf16_math(const at::Tensor& a, const at::Tensor& b, c10::string_view impl) {
  TORCH_CHECK(impl == "kiln" || impl == "kiln_bf16", "kiln's GEMM: unknown implementation ", impl, " (kiln, kiln_bf16)");
  const bool bf16_math = impl == "kiln_bf16";
  const bool dtypes_fit = b.scalar_type() == at::kFloat || (!bf16_math && b.scalar_type() == at::kBFloat16);
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && dtypes_fit,
              bf16_math ? "kiln's GEMM in bfloat16 fast math (kiln_bf16) takes float32 operands"
                        : "kiln's GEMM takes float32 or bfloat16 operands of one dtype",
              ", not ", a.scalar_type(), " and ", b.scalar_type());
  return bf16_math;
}

// A float32 A as bfloat16 fast math reads it: a bfloat16 copy [M, K], row-major, rounded to
// nearest even (kiln_gemm.h `convert_a_bf16`); A's rows are of unit stride.
at::Tensor a_in_bf16(const at::Tensor& a) {
  const int64_t M = a.size(0), K = a.size(1);
  at::Tensor out = buffer({M, K}, at::kBFloat16);
  kiln_gemm_convert_a_bf16(M, K, a.data_ptr(), a.stride(0), out.data_ptr());
  return out;
}

// `bf16_math`: float32 operands multiplied as bfloat16 (the weight's panels and A's copy rounded),
// the sums, epilogue and C float32.
at::Tensor mm_kiln(const at::Tensor& a_in, const at::Tensor& b, const std::optional<at::Tensor>& bias_in,
                   c10::string_view unary, const Scalars& scalars, c10::string_view algorithm, bool bf16_math) {
  bool bf16 = b.scalar_type() == at::kBFloat16;  // operands and C bfloat16
  int64_t K = b.size(0), N = b.size(1);
  at::Tensor panels = kiln_panels(b, [&] { return b; }, bf16_math);
  at::Tensor a = a_in.dim() == 2 && a_in.stride(1) == 1 ? a_in : a_in.contiguous();
  if (bf16_math) a = a_in_bf16(a);
  std::optional<at::Tensor> bias = bias_in;
  if (bias && bias->stride(0) != 1) bias = bias->contiguous();
  int64_t M = a.size(0);
  at::Tensor out = buffer({M, N}, b.scalar_type());
  KilnGemmEpilogue e = unary_epilogue(unary, algorithm, scalars);
  e.bias = bias ? bias->data_ptr() : nullptr;
  e.bias_bf16 = bias && bias->scalar_type() == at::kBFloat16;
  e.out_bf16 = bf16;
  bool plain = !bias && unary == "none" && !bf16;
  (bf16 || bf16_math ? kiln_gemm_bf16 : kiln_gemm_f32)(M, N, K, a.data_ptr(), a.stride(0), panels.data_ptr(),
                                                       out.data_ptr(), N, plain ? nullptr : &e, kiln_gemm_k_block());
  return out;
}

// `t` [..., width] as rows of `width` at one row stride, without the dispatcher where it can: `t`
// itself when it is contiguous (rows of stride `width`) or 2-D with unit columns (its row
// stride); else a contiguous copy.
at::Tensor rows_of(const at::Tensor& t, int64_t width) {
  if (t.is_contiguous() || (t.dim() == 2 && t.stride(1) == 1)) return t;
  return t.reshape({-1, width}).contiguous();
}

// kiln::mm_quant: a @ dequantize(qweight)ᵀ + bias, a post-op, a residual added after it, in kiln's
// GEMM over the weight packed once (kiln_gemm_quant.h; the quantized layout is kiln/quant's):
// `bits` 8 (qweight int8 [N, K], scales [N, 1]) or 4 (qweight uint8 [N, ceil(K / 2)], scales and
// zeros [N, ceil(K / group)]). `a` float32 [..., K]; the result [..., N]. `int8_activations` (int4):
// a's rows quantized to int8 per group first (kiln/quant/weights.py `quantize_activations`).
// `impl` "kiln", or "kiln_bf16": bfloat16 fast math (backend.fp32_gemm = bf16; a prompt's rows on
// AMX's tiles, kiln_gemm_quant.h `gemm_quant_bf16_math`), not with int8 activations.
// `e`: the epilogue after the bias and residual (a post-op, or a row norm: mm_quant_row_norm).
at::Tensor quant_product(const at::Tensor& a_in, const at::Tensor& qweight, const at::Tensor& scales,
                         const std::optional<at::Tensor>& zeros, int64_t bits, int64_t group_size,
                         const std::optional<at::Tensor>& bias_in, const std::optional<at::Tensor>& residual_in,
                         bool int8_activations, c10::string_view impl, KilnGemmEpilogue e) {
  TORCH_CHECK(bits == 8 || bits == 4, "kiln::mm_quant: bits must be 8 or 4, got ", bits);
  TORCH_CHECK(!int8_activations || bits == 4, "kiln::mm_quant: int8 activations are taken with int4 weights only");
  TORCH_CHECK(impl == "kiln" || impl == "kiln_bf16", "kiln::mm_quant: impl must be kiln or kiln_bf16, got ", impl);
  const bool bf16_math = impl == "kiln_bf16";
  TORCH_CHECK(!(bf16_math && int8_activations), "kiln::mm_quant: int8 activations are not taken in bfloat16 fast math");
  // bfloat16 activations (a bfloat16 model's layers): C bfloat16, as eager's linear makes it
  const bool bf16_rows = a_in.scalar_type() == at::kBFloat16;
  TORCH_CHECK(a_in.scalar_type() == at::kFloat || bf16_rows, "kiln::mm_quant: the activations must be float32 or "
              "bfloat16, got ", a_in.scalar_type());
  TORCH_CHECK(!bf16_rows || !(int8_activations || bf16_math || e.row_norm),
              "kiln::mm_quant: bfloat16 activations take neither int8 activations, bfloat16 fast math nor a row norm");
  const int64_t K = a_in.size(-1), group = bits == 8 ? K : group_size;
  TORCH_CHECK(group > 0 && qweight.size(1) == (bits == 8 ? K : (K + 1) / 2) && scales.size(0) == qweight.size(0) &&
                  scales.size(1) == (K + group - 1) / group && (bits == 8 || (zeros && zeros->sizes() == scales.sizes())),
              "kiln::mm_quant: the quantized weight's tensors do not match K = ", K, " and group ", group);
  // A gated product (mm_quant_gated): its two halves, gate and up, each padded with zero columns to
  // whole panels, so that a gate panel and its up panel hold the same outputs' columns.
  const int64_t H = e.gated_width, panel = kiln_gemm_panel_columns();
  const int64_t half = H ? (H + panel - 1) / panel * panel : 0, N = H ? 2 * half : qweight.size(0);
  auto halves_padded = [&](const at::Tensor& t) {
    if (!H || half == H) return t;
    at::Tensor out = at::empty({2 * half, t.size(1)}, t.options());
    out.zero_();
    out.narrow(0, 0, H).copy_(t.narrow(0, 0, H));
    out.narrow(0, half, H).copy_(t.narrow(0, H, H));
    return out;
  };
  at::Tensor packed_weight = packed(qweight, H ? "kiln_quant_gated" : "kiln_quant", [&] {
    at::Tensor q = halves_padded(qweight).contiguous(), s = halves_padded(scales.to(at::kFloat)).contiguous();
    at::Tensor zp = bits == 4 ? halves_padded(zeros->to(at::kFloat)).contiguous() : at::Tensor();
    // (the packed table keeps each zero point in 4 bits: kiln_gemm_quant.h int4_table_word)
    TORCH_CHECK(bits == 8 || zp.numel() == 0 || (zp.eq(zp.round()).all().item<bool>() && zp.min().item<float>() >= 0 &&
                                                  zp.max().item<float>() <= 15),
                "kiln::mm_quant: int4 zero points must be whole numbers in 0..15 (kiln.quantize makes them so)");
    at::Tensor out = pack_empty(kiln_gemm_quant_packed_bytes(int32_t(bits), K, N, group), qweight.options().dtype(at::kByte));
    kiln_gemm_quant_pack(int32_t(bits), K, N, group, static_cast<const uint8_t*>(q.data_ptr()), s.data_ptr<float>(),
                         bits == 4 ? zp.data_ptr<float>() : nullptr, out.data_ptr<uint8_t>());
    return out;
  });
  // A's rows and C's by pointer and row stride, not as 2-D views: a view through the dispatcher
  // (reshape, view) costs ~1 µs each, and a decode step makes ~50 of these products.
  const at::Tensor a = rows_of(a_in, K);
  const int64_t M = K ? a_in.numel() / K : 0, lda = a.dim() == 2 ? a.stride(0) : K;
  std::vector<int64_t> shape = a_in.sizes().vec();
  shape.back() = H ? H : N;
  const int64_t ldc = shape.back();
  at::Tensor out = buffer(shape, a_in.scalar_type());
  e.out_bf16 = bf16_rows;
  std::optional<at::Tensor> bias = bias_in, residual;
  if (bias && bias->stride(0) != 1) bias = bias->contiguous();
  if (residual_in) residual = rows_of(*residual_in, N);
  e.bias = bias ? bias->data_ptr() : nullptr;
  e.bias_bf16 = bias && bias->scalar_type() == at::kBFloat16;
  e.residual = residual ? residual->data_ptr() : nullptr;
  e.residual_bf16 = residual && residual->scalar_type() == at::kBFloat16;
  e.ld_residual = residual ? (residual->dim() == 2 ? residual->stride(0) : N) : 0;
  if (bf16_rows)
    kiln_gemm_quant_bf16_rows(int32_t(bits), M, N, K, group, a.data_ptr(), lda, packed_weight.data_ptr<uint8_t>(),
                              out.data_ptr(), ldc, &e, kiln_gemm_k_block());
  else if (int8_activations)
    kiln_gemm_quant_a8_f32(1, M, N, K, group, a.data_ptr<float>(), lda, packed_weight.data_ptr<uint8_t>(),
                           out.data_ptr(), ldc, &e, kiln_gemm_k_block());
  else
    (bf16_math ? kiln_gemm_quant_bf16_math : kiln_gemm_quant_f32)(int32_t(bits), M, N, K, group, a.data_ptr<float>(),
                                                                  lda, packed_weight.data_ptr<uint8_t>(), out.data_ptr(),
                                                                  ldc, &e, kiln_gemm_k_block());
  return out;
}

at::Tensor mm_quant(const at::Tensor& a_in, const at::Tensor& qweight, const at::Tensor& scales,
                    const std::optional<at::Tensor>& zeros, int64_t bits, int64_t group_size,
                    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                    c10::string_view unary, const Scalars& scalars, std::optional<c10::string_view> algorithm,
                    bool int8_activations, c10::string_view impl) {
  return quant_product(a_in, qweight, scales, zeros, bits, group_size, bias, residual, int8_activations, impl,
                       unary_epilogue(unary, algorithm.value_or(""), scalars));
}

// kiln::mm_quant_gated: a gated MLP's gate and up in one product (kiln/passes/quantized_gemm.py),
// unary(a @ gateᵀ + bias_g) * (a @ upᵀ + bias_u), qweight's (scales', zeros', bias's) first half of
// rows the gate's and second half up's; the result [..., half the rows]. The products of a column
// of both halves meet in the GEMM's store (Epilogue::gated_width), not in a kernel after it.
at::Tensor mm_quant_gated(const at::Tensor& a_in, const at::Tensor& qweight, const at::Tensor& scales,
                          const std::optional<at::Tensor>& zeros, int64_t bits, int64_t group_size,
                          const std::optional<at::Tensor>& bias, c10::string_view unary, const Scalars& scalars,
                          std::optional<c10::string_view> algorithm, bool int8_activations, c10::string_view impl) {
  TORCH_CHECK(qweight.size(0) % 2 == 0 && qweight.size(0) > 0,
              "kiln::mm_quant_gated: the weight's rows are a gate's and an up's, an even count, got ", qweight.size(0));
  KilnGemmEpilogue e = unary_epilogue(unary, algorithm.value_or(""), scalars);
  e.gated_width = qweight.size(0) / 2;
  return quant_product(a_in, qweight, scales, zeros, bits, group_size, bias, std::nullopt, int8_activations, impl, e);
}

// The row norms of kiln_gemm.h (kiln_gemm::RowNorm), by number.
enum { ROW_LAYER_NORM = 1, ROW_RMS_NORM, ROW_SOFTMAX, ROW_LOG_SOFTMAX };

std::optional<at::Tensor> unit_stride(const std::optional<at::Tensor>& t) {
  return t && t->stride(-1) != 1 ? std::optional<at::Tensor>(t->contiguous()) : t;
}

// A row norm's weight or bias as the GEMM reads it: float32 with unit stride (a bfloat16 one's
// float32 copy made once per weight).
std::optional<at::Tensor> norm_vector(const std::optional<at::Tensor>& t) {
  if (!t || t->scalar_type() == at::kFloat) return unit_stride(t);
  return std::optional<at::Tensor>(packed(*t, "float32", [&] { return t->to(at::kFloat).contiguous(); }));
}

// norm(a @ dequantize(qweight)ᵀ + bias + residual) over rows in kiln's quantized GEMM
// (kiln/passes/gemm_layer_norm.py): a layer norm, or with `rms` an RMS norm, of each row after its
// store, as mm_row_norm's below. With `keep_sum`, (the sum, its norm): a pre-norm decoder's
// residual stream reads the sum again. Float32 throughout, as mm_quant.
std::pair<at::Tensor, at::Tensor> mm_quant_row_norm(const at::Tensor& a, const at::Tensor& qweight,
                                                    const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
                                                    int64_t bits, int64_t group_size,
                                                    const std::optional<at::Tensor>& bias,
                                                    const std::optional<at::Tensor>& residual,
                                                    const std::optional<at::Tensor>& weight_in,
                                                    const std::optional<at::Tensor>& norm_bias_in, double eps,
                                                    bool rms, bool keep_sum, bool int8_activations,
                                                    c10::string_view impl) {
  TORCH_CHECK(!(rms && norm_bias_in), "kiln::mm_quant_layer_norm: an RMS norm takes no norm_bias");
  const std::optional<at::Tensor> weight = norm_vector(weight_in), norm_bias = norm_vector(norm_bias_in);
  const int64_t N = qweight.size(0);
  for (const auto& v : {weight, norm_bias})
    TORCH_CHECK(!v || v->numel() == N, "kiln::mm_quant_layer_norm: a norm weight or bias of ", v->numel(),
                " entries for rows of ", N);
  KilnGemmEpilogue e{};
  e.row_norm = rms ? ROW_RMS_NORM : ROW_LAYER_NORM;
  e.norm_eps = static_cast<float>(eps);
  e.norm_weight = weight ? weight->data_ptr<float>() : nullptr;
  e.norm_bias = norm_bias ? norm_bias->data_ptr<float>() : nullptr;
  at::Tensor normed;
  if (keep_sum) {
    std::vector<int64_t> shape = a.sizes().vec();
    shape.back() = N;
    normed = buffer(shape, at::kFloat);
    e.norm_out = normed.data_ptr();
    e.ld_norm_out = N;
  }
  at::Tensor out = quant_product(a, qweight, scales, zeros, bits, group_size, bias, residual, int8_activations, impl, e);
  return {out, normed};
}

// kiln::mm_quant_layer_norm: layer_norm(mm_quant's product + bias + residual), or with `rms` an RMS norm.
at::Tensor mm_quant_layer_norm(const at::Tensor& a, const at::Tensor& qweight, const at::Tensor& scales,
                               const std::optional<at::Tensor>& zeros, int64_t bits, int64_t group_size,
                               const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                               const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& norm_bias,
                               double eps, bool rms, bool int8_activations, c10::string_view impl) {
  return mm_quant_row_norm(a, qweight, scales, zeros, bits, group_size, bias, residual, weight, norm_bias, eps, rms,
                           false, int8_activations, impl).first;
}

// kiln::mm_quant_add_layer_norm: (the sum, its norm).
std::tuple<at::Tensor, at::Tensor> mm_quant_add_layer_norm(
    const at::Tensor& a, const at::Tensor& qweight, const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
    int64_t bits, int64_t group_size, const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& norm_bias, double eps, bool rms,
    bool int8_activations, c10::string_view impl) {
  auto [sum, normed] = mm_quant_row_norm(a, qweight, scales, zeros, bits, group_size, bias, residual, weight,
                                         norm_bias, eps, rms, true, int8_activations, impl);
  return {sum, normed};
}

// norm(a @ b + bias + residual) over rows in kiln's GEMM (kiln/externs/prepacked.py
// `_mm_layer_norm`, `_mm_softmax`): the rows normalized in the GEMM's parallel region after their
// store. With `keep_sum`, (the sum, its norm) as `_mm_add_layer_norm`; else (the norm, undefined).
// `row_norm`: a layer norm, an RMS norm (T5's, Llama's; no norm bias), a softmax or log-softmax
// (no weight, norm bias or eps). bfloat16 operands: the sum is float32 (C, a scratch), the norm
// and the kept sum written as bfloat16 from it by the row pass; a bfloat16 norm weight or bias read
// as float32 (made once per weight). `impl` "kiln_bf16": float32 operands in bfloat16 fast math,
// everything after the products float32, as for "kiln" in float32.
std::pair<at::Tensor, at::Tensor> mm_row_norm(const at::Tensor& a_in, const at::Tensor& b,
                                              const std::optional<at::Tensor>& bias_in,
                                              const std::optional<at::Tensor>& residual_in,
                                              const std::optional<at::Tensor>& weight_in,
                                              const std::optional<at::Tensor>& norm_bias_in, double eps,
                                              int32_t row_norm, bool keep_sum, c10::string_view impl) {
  const bool bf16_math = kiln_bf16_math(a_in, b, impl);
  const bool bf16 = b.scalar_type() == at::kBFloat16;  // operands, norm and kept sum bfloat16
  TORCH_CHECK(row_norm >= ROW_LAYER_NORM && row_norm <= ROW_LOG_SOFTMAX, "kiln's GEMM: row norm ", row_norm,
              ", not 1 (layer norm), 2 (RMS norm), 3 (softmax) or 4 (log-softmax)");
  TORCH_CHECK(!(row_norm == ROW_RMS_NORM && norm_bias_in), "kiln::mm_layer_norm: an RMS norm takes no norm_bias");
  TORCH_CHECK(row_norm <= ROW_RMS_NORM || (!weight_in && !norm_bias_in),
              "kiln::mm_softmax: a softmax takes no weight or norm_bias");
  const int64_t K = b.size(0), N = b.size(1);
  at::Tensor panels = kiln_panels(b, [&] { return b; }, bf16_math);
  at::Tensor a = a_in.dim() == 2 && a_in.stride(1) == 1 ? a_in : a_in.contiguous();
  if (bf16_math) a = a_in_bf16(a);
  std::optional<at::Tensor> bias = unit_stride(bias_in), residual = unit_stride(residual_in),
                            weight = norm_vector(weight_in), norm_bias = norm_vector(norm_bias_in);
  const int64_t M = a.size(0);
  at::Tensor out = buffer({M, N}, at::kFloat);
  KilnGemmEpilogue e{};
  e.bias = bias ? bias->data_ptr() : nullptr;
  e.bias_bf16 = bias && bias->scalar_type() == at::kBFloat16;
  e.residual = residual ? residual->data_ptr() : nullptr;
  e.residual_bf16 = residual && residual->scalar_type() == at::kBFloat16;
  e.ld_residual = residual ? residual->stride(0) : 0;
  e.row_norm = row_norm;
  e.norm_eps = static_cast<float>(eps);
  e.norm_weight = weight ? weight->data_ptr<float>() : nullptr;
  e.norm_bias = norm_bias ? norm_bias->data_ptr<float>() : nullptr;
  at::Tensor normed, sum;
  if (keep_sum || bf16) {
    normed = buffer({M, N}, b.scalar_type());
    e.norm_out = normed.data_ptr();
    e.ld_norm_out = N;
    e.norm_out_bf16 = bf16;
  }
  if (keep_sum && bf16) {
    sum = buffer({M, N}, at::kBFloat16);
    e.sum_out = sum.data_ptr();
    e.ld_sum_out = N;
  }
  (bf16 || bf16_math ? kiln_gemm_bf16 : kiln_gemm_f32)(M, N, K, a.data_ptr(), a.stride(0), panels.data_ptr(),
                                                       out.data_ptr(), N, &e, kiln_gemm_k_block());
  if (keep_sum) return {bf16 ? sum : out, normed};
  return {bf16 ? normed : out, at::Tensor()};
}

// kiln::mm: the implementation the autotuner chose (kiln/autotune/gemm.py), its packed weight made
// on first use and kept per weight and version.
// kiln::post_op: y with a post-op applied as ATen computes it, what the implementations that do
// not apply it inside their product run after it (the autotuner times them followed by it).
at::Tensor post_op(const at::Tensor& y, c10::string_view unary, const Scalars& scalars,
                   std::optional<c10::string_view> algorithm) {
  at::Tensor out = unary_aten(y, unary, scalars, algorithm.value_or(""));
  return out.is_same(y) ? y.clone() : out;  // (a result is never its input: the schema says no alias)
}

// kiln::mm_layer_norm: layer_norm(a @ b + bias + residual), or with `rms` an RMS norm; `impl` kiln
// or kiln_bf16 (bfloat16 fast math), as kiln::mm's.
at::Tensor mm_layer_norm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& norm_bias, double eps, bool rms, c10::string_view impl) {
  return mm_row_norm(a, b, bias, residual, weight, norm_bias, eps, rms ? ROW_RMS_NORM : ROW_LAYER_NORM, false, impl)
      .first;
}

// kiln::mm_add_layer_norm: (the sum, its norm); a pre-norm model reads the sum again as its
// residual stream.
std::tuple<at::Tensor, at::Tensor> mm_add_layer_norm(const at::Tensor& a, const at::Tensor& b,
                                                     const std::optional<at::Tensor>& bias,
                                                     const std::optional<at::Tensor>& residual,
                                                     const std::optional<at::Tensor>& weight,
                                                     const std::optional<at::Tensor>& norm_bias, double eps, bool rms,
                                                     c10::string_view impl) {
  auto [sum, normed] = mm_row_norm(a, b, bias, residual, weight, norm_bias, eps, rms ? ROW_RMS_NORM : ROW_LAYER_NORM, true,
                                   impl);
  return {sum, normed};
}

// kiln::mm_softmax: softmax(a @ b + bias + residual) over rows (`log`: log_softmax); a
// classifier's probabilities, an MoE router's weights over its experts.
at::Tensor mm_softmax(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                      const std::optional<at::Tensor>& residual, bool log, c10::string_view impl) {
  return mm_row_norm(a, b, bias, residual, std::nullopt, std::nullopt, 0.0, log ? ROW_LOG_SOFTMAX : ROW_SOFTMAX, false,
                     impl)
      .first;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias, c10::string_view unary,
              const Scalars& scalars, std::optional<c10::string_view> algorithm_or_none, c10::string_view impl) {
  const c10::string_view algorithm = algorithm_or_none.value_or("");
  if (impl == "kiln" || impl == "kiln_bf16") return mm_kiln(a, b, bias, unary, scalars, algorithm, kiln_bf16_math(a, b, impl));
  const kiln_team::Narrowed team;  // (ATen's and MKL's threads, for the implementations below)
  if (impl == "mkl") {
    static auto reorder = find_op("mkl::_mkl_reorder_linear_weight", "").typed<at::Tensor(const at::Tensor&, int64_t)>();
    static auto linear = find_op("mkl::_mkl_linear", "")
        .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t)>();
    int64_t m = a.size(0);
    at::Tensor weight = packed(b, "mkl" + std::to_string(m), [&] { return reorder.call(b.t(), m); });
    at::Tensor origin = packed(b, "t", [&] { return b.detach().t(); });
    return unary_aten(linear.call(a.contiguous(), weight, origin, bias, m), unary, scalars, algorithm);
  }
  if (impl == "onednn") {
    static auto reorder = find_op("mkldnn::_reorder_linear_weight", "")
        .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
    static auto linear = find_op("mkldnn::_linear_pointwise", "")
        .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                          c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
    int64_t m = a.size(0);
    at::Tensor weight = packed(b, "onednn" + std::to_string(m), [&] { return reorder.call(b.t(), m); });
    return linear.call(a.contiguous(), weight, bias, unary, scalars, algorithm);
  }
  at::Tensor weight = b;
  if (impl == "aten_kn") weight = packed(b, "kn", [&] { return b.contiguous(); });
  else if (impl == "aten_nk") weight = packed(b, "nk", [&] { return b.t().contiguous().t(); });
  else TORCH_CHECK(impl == "aten", "kiln::mm: unknown implementation ", impl,
                   " (aten, aten_kn, aten_nk, kiln, kiln_bf16, mkl, onednn)");
  // The CPU kernels directly: a wrapper's graph is functional and on the CPU, so the dispatcher's
  // autograd and view layers have nothing to do (~0.3 us a call at batch-1 sizes).
  return unary_aten(bias ? at::cpu::addmm(*bias, a, weight) : at::cpu::mm(a, weight), unary, scalars, algorithm);
}

// ---- kiln::conv (2-d) -----------------------------------------------------------------------------

// kiln's own kernel, for depthwise convolutions (weight [C, 1, KH, KW], groups = C), channels-last.
at::Tensor conv_depthwise(const at::Tensor& x_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias_in,
                          const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                          const std::vector<int64_t>& dilation, c10::string_view unary, const Scalars& scalars,
                          c10::string_view algorithm, const std::optional<at::Tensor>& other_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && weight.dim() == 4 && weight.size(1) == 1 && stride.size() == 2,
              "kiln::conv: kiln's kernel runs float32 2-d depthwise convolutions only");
  const int64_t C = weight.size(0), KH = weight.size(2), KW = weight.size(3);
  at::Tensor wp = packed(weight, "kiln_depthwise", [&] {
    at::Tensor w = weight.contiguous(), out = at::empty({KH * KW * C}, weight.options());
    kiln_depthwise_pack_f32(w.data_ptr<float>(), C, KH * KW, out.data_ptr<float>());
    return out;
  });
  at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3);
  // [ph, pw] or [top, left, bottom, right]: the kernel reads inside the image only, so padding after
  // it is only in the output's size.
  const bool four = padding.size() == 4;
  const int64_t top = padding[0], left = padding[1], bottom = padding[four ? 2 : 0], right = padding[four ? 3 : 1];
  const int64_t OH = (H + top + bottom - dilation[0] * (KH - 1) - 1) / stride[0] + 1;
  const int64_t OW = (W + left + right - dilation[1] * (KW - 1) - 1) / stride[1] + 1;
  at::Tensor y = at::empty({N, C, OH, OW}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  std::optional<at::Tensor> other, bias;
  if (other_in) other = other_in->contiguous(at::MemoryFormat::ChannelsLast);
  if (bias_in) bias = bias_in->contiguous();
  KilnGemmEpilogue e = unary_epilogue(unary, algorithm, scalars);
  const int64_t shape[14] = {N, H, W, C, KH, KW, OH, OW, stride[0], stride[1], top, left, dilation[0], dilation[1]};
  kiln_depthwise_f32(shape, x.data_ptr<float>(), wp.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
                     other ? other->data_ptr<float>() : nullptr, y.data_ptr<float>(), &e);
  return y;
}

// kiln's GEMM, for convolutions of non-overlapping windows (kiln/externs/kiln_conv_gemm.py): 2-d,
// one group, no padding, a 1x1 kernel or a stride equal to the kernel's size. Channels-last input
// as its windows' rows [N*OH*OW, KH*KW*C] (a view for 1x1 of stride 1, else a copy) @ weight
// [KH*KW*C, K], the added tensor before the unary op, written channels-last.
bool conv_is_gemm(const at::Tensor& weight, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                  const std::vector<int64_t>& dilation, int64_t groups) {
  if (weight.dim() != 4 || groups != 1 || stride.size() != 2 || padding[0] != 0 || padding[1] != 0) return false;
  const int64_t kh = weight.size(2), kw = weight.size(3);
  return (kh == 1 && kw == 1) || (stride[0] == kh && stride[1] == kw && dilation[0] == 1 && dilation[1] == 1);
}

at::Tensor conv_gemm(const at::Tensor& x_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias_in,
                     const std::vector<int64_t>& stride, c10::string_view unary, const Scalars& scalars,
                     c10::string_view algorithm, const std::optional<at::Tensor>& other_in) {
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x_in.scalar_type() == weight.scalar_type() && (bf16 || weight.scalar_type() == at::kFloat),
              "kiln::conv: kiln's GEMM takes float32 or bfloat16 operands of one dtype");
  const int64_t K = weight.size(0), C = weight.size(1), KH = weight.size(2), KW = weight.size(3);
  at::Tensor panels = kiln_panels(weight, [&] { return weight.permute({2, 3, 1, 0}).reshape({KH * KW * C, K}); });
  at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3);
  const int64_t OH = (H - KH) / stride[0] + 1, OW = (W - KW) / stride[1] + 1, M = N * OH * OW;
  at::Tensor rows = x.permute({0, 2, 3, 1})
                        .as_strided({N, OH, OW, KH, KW, C}, {H * W * C, stride[0] * W * C, stride[1] * C, W * C, C, 1})
                        .reshape({M, KH * KW * C});
  at::Tensor y = at::empty({N, K, OH, OW}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  std::optional<at::Tensor> other, bias;
  if (other_in) other = other_in->contiguous(at::MemoryFormat::ChannelsLast);
  if (bias_in) bias = bias_in->contiguous();
  KilnGemmEpilogue e = unary_epilogue(unary, algorithm, scalars);
  e.bias = bias ? bias->data_ptr() : nullptr;
  e.bias_bf16 = bias && bias->scalar_type() == at::kBFloat16;
  e.residual = other ? other->data_ptr() : nullptr;
  e.ld_residual = K;  // (channels-last: a pixel's K channels, then the next pixel's)
  e.residual_bf16 = other && other->scalar_type() == at::kBFloat16;
  e.residual_before_unary = 1;
  e.out_bf16 = bf16;
  (bf16 ? kiln_gemm_bf16 : kiln_gemm_f32)(M, K, KH * KW * C, rows.data_ptr(), rows.stride(0), panels.data_ptr(),
                                           y.data_ptr(), K, &e, kiln_gemm_k_block());
  return y;
}

// kiln::conv (2-d): the implementation the autotuner chose (kiln/autotune/gemm.py), or the memory
// plan's `onednn_into_other`, which writes over `other` (kiln/schedule/memory.py).
at::Tensor conv(const at::Tensor& x_given, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                at::IntArrayRef stride_given, at::IntArrayRef padding_given, at::IntArrayRef dilation_given, int64_t groups,
                c10::string_view unary, const Scalars& scalars, std::optional<c10::string_view> algorithm_or_none,
                const std::optional<at::Tensor>& other, c10::string_view impl) {
  TORCH_CHECK(stride_given.size() == 2 && dilation_given.size() == 2 && (padding_given.size() == 2 || padding_given.size() == 4),
              "kiln::conv: 2-d convolutions only (stride, dilation of 2 entries; padding of 2 or 4), not stride ",
              stride_given, ", padding ", padding_given, ", dilation ", dilation_given);
  at::Tensor x_in = x_given;
  std::vector<int64_t> stride = stride_given.vec(), padding = padding_given.vec(), dilation = dilation_given.vec();
  const c10::string_view algorithm = algorithm_or_none.value_or("");
  // A padding of four entries, [top, left, bottom, right] (prepacked.py `symmetric`): kiln's
  // depthwise kernel pads inside its loops; the others read x padded by the difference first.
  const bool depthwise = weight.dim() == 4 && weight.size(1) == 1 && groups == weight.size(0);
  if (padding.size() == 4 && !(impl == "kiln" && depthwise)) {
    const int64_t ph = std::min(padding[0], padding[2]), pw = std::min(padding[1], padding[3]);
    x_in = at::constant_pad_nd(x_in, {padding[1] - pw, padding[3] - pw, padding[0] - ph, padding[2] - ph}, 0);
    padding = {ph, pw};
  }
  c10::IValue algorithm_ivalue = algorithm.empty() ? c10::IValue() : c10::IValue(std::string(algorithm));
  if (impl == "onednn" || impl == "onednn_into_other") {
    static auto reorder = find_op("mkldnn::_reorder_convolution_weight", "");
    static auto pointwise = find_op("mkldnn::_convolution_pointwise", "");
    static auto binary = find_op("mkldnn::_convolution_pointwise", "binary");
    static auto binary_into = find_op("mkldnn::_convolution_pointwise_", "binary");
    at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
    std::string kind = "onednn";
    for (int64_t s : x.sizes()) kind += "," + std::to_string(s);
    at::Tensor blocked = packed(weight, kind, [&] {
      return call_boxed(reorder, {weight, padding, stride, dilation, groups, x.sizes().vec()});
    });
    c10::IValue unary_or_none = unary == "none" ? c10::IValue() : c10::IValue(std::string(unary));
    if (impl == "onednn_into_other") {
      // Written over `other`, which the memory plan lets die here with the result's layout.
      return call_boxed(binary_into, {*other, x, blocked, bias, padding, stride, dilation, groups, std::string("add"),
                                      at::Scalar(1.0), unary_or_none, scalars, algorithm_ivalue});
    }
    if (!other) {
      return call_boxed(pointwise, {x, blocked, bias, padding, stride, dilation, groups, std::string(unary), scalars,
                                    algorithm_ivalue});
    }
    return call_boxed(binary, {x, other->contiguous(at::MemoryFormat::ChannelsLast), blocked, bias, padding, stride,
                               dilation, groups, std::string("add"), at::Scalar(1.0), unary_or_none,
                               scalars, algorithm_ivalue});
  }
  TORCH_CHECK(impl != "kiln" || depthwise || conv_is_gemm(weight, stride, padding, dilation, groups),
              "kiln::conv: kiln's kernels run depthwise convolutions and those of non-overlapping windows (1x1, or "
              "stride = kernel, no padding) only, not weight ", weight.sizes(), " in ", groups, " groups, stride ", stride,
              ", padding ", padding);
  if (impl == "kiln" && conv_is_gemm(weight, stride, padding, dilation, groups))
    return conv_gemm(x_in, weight, bias, stride, unary, scalars, algorithm, other);
  if (impl == "kiln") return conv_depthwise(x_in, weight, bias, stride, padding, dilation, unary, scalars, algorithm,
                                            other);
  const kiln_team::Narrowed team;  // (ATen's threads)
  at::Tensor x = x_in, w = weight;
  if (impl == "aten_channels_last") {
    x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
    w = packed(weight, "channels_last", [&] { return weight.contiguous(at::MemoryFormat::ChannelsLast); });
  } else {
    TORCH_CHECK(impl == "aten", "kiln::conv: unknown implementation ", impl,
                " (aten, aten_channels_last, kiln, onednn, onednn_into_other)");
  }
  at::Tensor y = at::convolution(x, w, bias, stride, padding, dilation, false, {0, 0}, groups);
  if (other) y = at::add(y, *other);
  return unary_aten(y, unary, scalars, algorithm);
}

// ---- kiln::attention ------------------------------------------------------------------------------

// Whether kiln's kernel computes this attention (the autotuner's view of it: kiln/externs/
// kiln_attention.py `applies`): float32 [B, H, S, D]
// operands of one batch and head count, v's head size a multiple of the vector width, and an
// additive float32 mask broadcastable to the scores, or none.
bool attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& mask) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4 || t->scalar_type() != at::kFloat) return false;
  }
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2), Dv = v.size(3);
  if (k.size(0) != B || k.size(1) != H || k.size(3) != D || v.size(0) != B || v.size(1) != H || v.size(2) != Sk ||
      Dv % kiln_vec_lanes() != 0 || B == 0 || H == 0 || Sq == 0 || Sk == 0 || D == 0 || Dv == 0) {
    return false;
  }
  if (!mask) return true;
  if (mask->scalar_type() != at::kFloat || mask->dim() != 4) return false;
  const int64_t scores[4] = {B, H, Sq, Sk};
  for (int d = 0; d < 4; ++d) {
    if (mask->size(d) != 1 && mask->size(d) != scores[d]) return false;
  }
  return true;
}

// The kernel steps along rows by pointer: a row's elements must be adjacent (a row of one element
// has no stride to mind).
at::Tensor rows_unit(const at::Tensor& t) { return t.stride(-1) == 1 || t.size(-1) == 1 ? t : t.contiguous(); }

// The output as ATen's CPU kernel makes it (its meta function: `empty_like(query)`), so that the
// graph's later views of it stay valid: q's order of dimensions, v's head size (its fake function,
// kiln_attention.py `output_like`).
at::Tensor attention_output(const at::Tensor& q, int64_t Dv) {
  if (Dv == q.size(3)) {  // (empty_like's layout, made without the dispatcher where q is dense)
    return q.is_non_overlapping_and_dense() ? strided_buffer(q.sizes(), q.strides(), q.scalar_type())
                                            : at::empty_like(q);
  }
  std::vector<int64_t> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q.stride(a) > q.stride(b); });
  return at::empty_permuted({q.size(0), q.size(1), q.size(2), Dv}, order, q.options());
}

// kiln::attention: q, k, v read where they
// lie once their rows are of unit stride, the mask expanded to the scores (zero strides along its
// broadcast dimensions) and copied only when its rows are not of unit stride.
at::Tensor attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                     const std::optional<at::Tensor>& mask_in, double scale, bool causal) {
  TORCH_CHECK(attention_applies(q_in, k_in, v_in, mask_in),
              "kiln::attention: kiln's kernel takes float32 [B, H, S, D] q, k, v with v's head size a multiple of ",
              kiln_vec_lanes(), " and a float32 mask broadcastable to the scores, not q ", q_in.sizes(), " ",
              q_in.scalar_type(), ", k ", k_in.sizes(), ", v ", v_in.sizes(), ", mask ",
              mask_in ? c10::str(mask_in->sizes(), " ", mask_in->scalar_type()) : std::string("None"));
  const at::Tensor result = attention_output(q_in, v_in.size(3));
  // The kernel writes rows of unit stride (where q's last dimension is not its innermost, into a copy first).
  at::Tensor out = result.stride(3) == 1 ? result : at::empty(result.sizes(), result.options());
  const at::Tensor q = rows_unit(q_in), k = rows_unit(k_in), v = rows_unit(v_in);
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2), Dv = v.size(3);
  // The mask's strides as expanded to [B, H, Sq, Sk] (zero along a broadcast dimension), read
  // from its own (expand through the dispatcher cost ~1 µs a call); copied where its rows would
  // not be of unit stride.
  at::Tensor mask;
  int64_t mask_strides[4] = {0, 0, 0, 0};
  if (mask_in) {
    mask = *mask_in;
    const int64_t scores[4] = {B, H, Sq, Sk};
    if (mask.size(-1) != Sk || (Sk > 1 && mask.stride(-1) != 1)) mask = mask.expand({B, H, Sq, Sk}).contiguous();
    for (int64_t i = 0, skip = 4 - mask.dim(); i < 4; ++i)
      mask_strides[i] = i < skip || mask.size(i - skip) != scores[i] ? 0 : mask.stride(i - skip);
  }
  const int64_t shape[21] = {B, H, Sq, Sk, D, Dv,
                             q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                             v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                             mask_strides[0], mask_strides[1], mask_strides[2]};
  kiln_attention_f32(shape, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                     mask.defined() ? mask.data_ptr<float>() : nullptr, out.data_ptr<float>(),
                     static_cast<float>(scale), causal ? 1 : 0);
  if (!out.is_same(result)) result.copy_(out);
  return result;
}

// ---- kiln's operators, defined once ---------------------------------------------------------------
// Each operator here is one C++ function, registered from this file twice over (docs/native.md):
// with the dispatcher under its schema (its CPU kernel; torch.ops.kiln.<name> from Python, whose
// fake function stays in Python), and in the runtime's own table of direct calls, which
// kiln_find_op consults first, so that a C++ wrapper calls the function itself with its arguments
// unboxed from kiln_arg (no IValue, no dispatcher). kiln's own runtime registers with the
// dispatcher (KILN_REGISTER_OPS, kiln/native/libkiln.py); an exported model's copy of the runtime
// does not (a process may load both), and finds its operators in its own table alone.

// A kiln_arg as the C++ parameter type of an operator's function.
template <typename T>
struct FromArg;
template <>
struct FromArg<at::Tensor> {
  static const at::Tensor& get(const kiln_arg& a) {
    TORCH_CHECK(a.kind == KILN_TENSOR && a.p, "kiln runtime: a tensor argument missing");
    return tensor_of(const_cast<void*>(a.p));
  }
};
template <>
struct FromArg<std::optional<at::Tensor>> {
  static std::optional<at::Tensor> get(const kiln_arg& a) {
    return a.kind == KILN_NONE ? std::nullopt : std::optional<at::Tensor>(FromArg<at::Tensor>::get(a));
  }
};
template <>
struct FromArg<double> {
  static double get(const kiln_arg& a) { return scalar_value(a); }
};
template <>
struct FromArg<int64_t> {
  static int64_t get(const kiln_arg& a) { return a.i; }
};
template <>
struct FromArg<bool> {
  static bool get(const kiln_arg& a) { return a.i != 0; }
};
template <>
struct FromArg<c10::string_view> {
  static c10::string_view get(const kiln_arg& a) {
    TORCH_CHECK(a.kind == KILN_STRING && a.p, "kiln runtime: a string argument missing");
    return c10::string_view(static_cast<const char*>(a.p));
  }
};
template <>
struct FromArg<std::optional<c10::string_view>> {
  static std::optional<c10::string_view> get(const kiln_arg& a) {
    return a.kind == KILN_NONE ? std::nullopt : std::optional<c10::string_view>(FromArg<c10::string_view>::get(a));
  }
};
template <>
struct FromArg<c10::ArrayRef<int64_t>> {  // (the values, which the call's IntArrayRef views)
  static std::vector<int64_t> get(const kiln_arg& a) {
    TORCH_CHECK(a.kind == KILN_LIST, "kiln runtime: an int[] argument missing");
    const kiln_arg* items = static_cast<const kiln_arg*>(a.p);
    std::vector<int64_t> values(a.n);
    for (int64_t k = 0; k < a.n; ++k) values[k] = items[k].i;
    return values;
  }
};
template <>
struct FromArg<Scalars> {
  static Scalars get(const kiln_arg& a) {
    TORCH_CHECK(a.kind == KILN_LIST, "kiln runtime: a Scalar?[] argument missing");
    const kiln_arg* items = static_cast<const kiln_arg*>(a.p);
    Scalars values;
    values.reserve(a.n);
    for (int64_t k = 0; k < a.n; ++k) {
      if (items[k].kind == KILN_NONE) values.push_back(std::nullopt);
      else if (items[k].kind == KILN_DOUBLE) values.push_back(at::Scalar(items[k].d));
      else values.push_back(at::Scalar(items[k].i));
    }
    return values;
  }
};

void put_results(at::Tensor t, kiln_tensor* outs, int64_t nouts, int64_t& k) {
  if (k < nouts) outs[k] = new_handle(std::move(t));
  ++k;
}
template <typename... T>
void put_results(std::tuple<T...> ts, kiln_tensor* outs, int64_t nouts, int64_t& k) {
  std::apply([&](auto&... t) { (put_results(std::move(t), outs, nouts, k), ...); }, ts);
}

// A direct call: the operator's arguments in schema order, its results flattened into `outs`.
using DirectCall = void (*)(const kiln_arg* args, int64_t nargs, kiln_tensor* outs, int64_t nouts);

template <typename Fn>
struct Direct;
template <typename R, typename... A>
struct Direct<R (*)(A...)> {
  template <R (*F)(A...), size_t... I>
  static R unboxed(const kiln_arg* args, std::index_sequence<I...>) {
    return F(FromArg<std::decay_t<A>>::get(args[I])...);
  }
  template <R (*F)(A...)>
  static void call(const kiln_arg* args, int64_t nargs, kiln_tensor* outs, int64_t nouts) {
    TORCH_CHECK(nargs == static_cast<int64_t>(sizeof...(A)), "kiln runtime: the operator takes ", sizeof...(A),
                " arguments, the wrapper gave ", nargs);
    int64_t k = 0;
    put_results(unboxed<F>(args, std::index_sequence_for<A...>{}), outs, nouts, k);
    for (; k < nouts; ++k) outs[k] = nullptr;
  }
};

// The runtime's table of direct calls, by qualified name ("kiln::attention").
std::map<std::string, DirectCall>& direct_calls() {
  static std::map<std::string, DirectCall> table;
  return table;
}

bool add_direct_call(const char* name, DirectCall call) {
  direct_calls().emplace(name, call);
  return true;
}

// An operator handle as kiln_find_op makes it: the runtime's own function, or the dispatcher's.
struct FoundOp {
  DirectCall direct;
  std::optional<c10::OperatorHandle> handle;
};

}  // namespace

// KILN_OPERATOR(name, schema): `name`, a function of this file, as the operator kiln::name.
#ifdef KILN_REGISTER_OPS
#define KILN_OPERATOR(name, schema)                                                                    \
  TORCH_LIBRARY_FRAGMENT(kiln, m) { m.def(schema); }                                                  \
  TORCH_LIBRARY_IMPL(kiln, CPU, m) { m.impl(#name, TORCH_FN(name)); }                                 \
  static const bool kiln_direct_##name =                                                             \
      add_direct_call("kiln::" #name, &Direct<decltype(&name)>::call<&name>);
#else
#define KILN_OPERATOR(name, schema)                                                                    \
  static const bool kiln_direct_##name =                                                             \
      add_direct_call("kiln::" #name, &Direct<decltype(&name)>::call<&name>);
#endif

// softmax(q · kᵀ · scale + attn_mask) · v in kiln's kernel (fake function:
// kiln/externs/kiln_attention.py).
KILN_OPERATOR(attention,
              "attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, float scale, bool is_causal) -> Tensor")
// a @ b + bias, then a post-op (oneDNN's names, as kiln::post_op applies them), by the
// implementation `impl` (aten, aten_kn, aten_nk, kiln, mkl, onednn; kiln_bf16: kiln's GEMM in
// bfloat16 fast math, backend.fp32_gemm).
KILN_OPERATOR(mm, "mm(Tensor a, Tensor b, Tensor? bias, str unary, Scalar?[] scalars, str? algorithm, str impl) -> Tensor")
KILN_OPERATOR(post_op, "post_op(Tensor y, str unary, Scalar?[] scalars, str? algorithm) -> Tensor")
// A weight-only quantized product in kiln's GEMM (kiln/passes/quantized_gemm.py, kiln/quant); `impl`
// kiln or kiln_bf16 (bfloat16 fast math, backend.fp32_gemm).
KILN_OPERATOR(mm_quant, "mm_quant(Tensor a, Tensor qweight, Tensor scales, Tensor? zeros, int bits, int group_size, "
                        "Tensor? bias, Tensor? residual, str unary, Scalar?[] scalars, str? algorithm, "
                        "bool int8_activations=False, str impl='kiln') -> Tensor")
// A gated MLP's gate and up in one (kiln/passes/quantized_gemm.py): unary(gate) * up.
KILN_OPERATOR(mm_quant_gated, "mm_quant_gated(Tensor a, Tensor qweight, Tensor scales, Tensor? zeros, int bits, "
                              "int group_size, Tensor? bias, str unary, Scalar?[] scalars, str? algorithm, "
                              "bool int8_activations=False, str impl='kiln') -> Tensor")
// The same with a layer or RMS norm of the rows (kiln/passes/gemm_layer_norm.py).
KILN_OPERATOR(mm_quant_layer_norm,
              "mm_quant_layer_norm(Tensor a, Tensor qweight, Tensor scales, Tensor? zeros, int bits, int group_size, "
              "Tensor? bias, Tensor? residual, Tensor? weight, Tensor? norm_bias, float eps, bool rms=False, "
              "bool int8_activations=False, str impl='kiln') -> Tensor")
KILN_OPERATOR(mm_quant_add_layer_norm,
              "mm_quant_add_layer_norm(Tensor a, Tensor qweight, Tensor scales, Tensor? zeros, int bits, "
              "int group_size, Tensor? bias, Tensor? residual, Tensor? weight, Tensor? norm_bias, float eps, "
              "bool rms=False, bool int8_activations=False, str impl='kiln') -> (Tensor, Tensor)")
// The row norms in kiln's GEMM (kiln/passes/gemm_layer_norm.py); `impl` kiln or kiln_bf16.
KILN_OPERATOR(mm_layer_norm, "mm_layer_norm(Tensor a, Tensor b, Tensor? bias, Tensor? residual, Tensor? weight, "
                             "Tensor? norm_bias, float eps, bool rms=False, str impl='kiln') -> Tensor")
KILN_OPERATOR(mm_add_layer_norm, "mm_add_layer_norm(Tensor a, Tensor b, Tensor? bias, Tensor? residual, Tensor? weight, "
                                 "Tensor? norm_bias, float eps, bool rms=False, str impl='kiln') -> (Tensor, Tensor)")
KILN_OPERATOR(mm_softmax, "mm_softmax(Tensor a, Tensor b, Tensor? bias, Tensor? residual, bool log=False, "
                          "str impl='kiln') -> Tensor")
// 2-d convolution, a post-op and an added tensor (`other`, before the post-op); `padding` as
// ATen's or [top, left, bottom, right] (kiln/passes/conv_prepack.py).
KILN_OPERATOR(conv, "conv(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
                    "str unary, Scalar?[] scalars, str? algorithm, Tensor? other, str impl) -> Tensor")

extern "C" {

kiln_tensor kiln_empty_strided(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype) {
  // (a C++ wrapper runs on the CPU: its buffers are made without the dispatcher)
  return new_handle(strided_buffer(c10::IntArrayRef(sizes, ndim), c10::IntArrayRef(strides, ndim),
                                   static_cast<c10::ScalarType>(dtype)));
}

kiln_tensor kiln_share(kiln_tensor t) { return new_handle(tensor_of(t)); }

void kiln_release(kiln_tensor t) { release_handle(t); }

kiln_tensor kiln_reinterpret(kiln_tensor t, int64_t ndim, const int64_t* sizes, const int64_t* strides, int64_t offset) {
  // The tensor a view op of the graph makes, without the dispatcher: a functional graph only reads
  // through it, so it needs no view bookkeeping (autograd's view record, a shared version counter).
  const at::Tensor& base = tensor_of(t);
  auto alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(), base.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(sizes, ndim), c10::IntArrayRef(strides, ndim),
                                                      std::make_optional(offset));
  return new_handle(std::move(alias));
}

void* kiln_data(kiln_tensor t) { return tensor_of(t).data_ptr(); }

int64_t kiln_size(kiln_tensor t, int64_t dim) { return tensor_of(t).size(dim); }

int kiln_in_layout(kiln_tensor* t, int64_t ndim, const int64_t* sizes, const int64_t* strides) {
  return guarded([&] {
    at::Tensor& x = tensor_of(*t);
    if (x.numel() <= 1 || x.strides() == c10::IntArrayRef(strides, ndim)) return;
    at::Tensor copy = at::empty_strided(c10::IntArrayRef(sizes, ndim), c10::IntArrayRef(strides, ndim), x.options());
    copy.copy_(x);
    x = std::move(copy);
  });
}

void* kiln_find_op(const char* name, const char* overload) {
  // kiln's own operators are called directly (their one overload is the default)
  if (!overload[0]) {
    auto direct = direct_calls().find(name);
    if (direct != direct_calls().end()) return new FoundOp{direct->second, std::nullopt};
  }
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle.has_value()) {
    last_error = std::string("no operator ") + name + (overload[0] ? "." : "") + overload;
    return nullptr;
  }
  return new FoundOp{nullptr, *handle};
}

int kiln_call_op(void* op, const kiln_arg* args, int64_t nargs, kiln_tensor* outs, int64_t nouts) {
  return guarded([&] {
    const FoundOp& found = *static_cast<FoundOp*>(op);
    if (found.direct) return found.direct(args, nargs, outs, nouts);
    const kiln_team::Narrowed team;  // (an ATen operator's threads)
    const auto& handle = *found.handle;
    const auto& schema = handle.schema();
    TORCH_CHECK(static_cast<size_t>(nargs) == schema.arguments().size(), "kiln runtime: ", schema.name(), " takes ",
                schema.arguments().size(), " arguments, the wrapper gave ", nargs);
    torch::jit::Stack stack;
    stack.reserve(nargs);
    for (int64_t k = 0; k < nargs; ++k) stack.push_back(to_ivalue(args[k], schema.arguments()[k].type()));
    handle.callBoxed(stack);
    std::vector<kiln_tensor> results;
    for (const c10::IValue& v : stack) flatten(v, results);
    for (size_t k = 0; k < results.size(); ++k) {
      if (static_cast<int64_t>(k) < nouts) outs[k] = results[k];
      else release_handle(results[k]);
    }
    for (int64_t k = results.size(); k < nouts; ++k) outs[k] = nullptr;
  });
}

int64_t kiln_packs_held(void) {
  std::lock_guard<std::mutex> lock(packs_mutex);
  return static_cast<int64_t>(packs.size());
}

void kiln_drop_packs(kiln_tensor weight) {
  const at::Tensor& w = tensor_of(weight);
  std::lock_guard<std::mutex> lock(packs_mutex);
  for (auto it = packs.begin(); it != packs.end();)
    it = it->first.first == w.unsafeGetTensorImpl() ? packs.erase(it) : std::next(it);
}

int64_t kiln_packed_bytes(kiln_tensor weight) {
  // Every packed form held for this weight now, less those that are views of the weight's own
  // memory (MKL's transposed view kept beside its pack; a dense form the weight already had).
  const at::Tensor& w = tensor_of(weight);
  std::lock_guard<std::mutex> lock(packs_mutex);
  int64_t bytes = 0;
  for (const auto& [key, pack] : packs) {
    if (key.first != w.unsafeGetTensorImpl() || pack.weight.expired() || pack.version != w._version()) continue;
    if (pack.packed.has_storage() && w.has_storage() && pack.packed.storage().is_alias_of(w.storage())) continue;
    bytes += pack.packed.numel() * static_cast<int64_t>(pack.packed.element_size());
  }
  return bytes;
}

int kiln_vector_lanes(void) { return kiln_vec_lanes(); }

int kiln_huge_page_reads(void) { return kiln_gemm_huge_page_packs(); }

void kiln_set_buffer_cache(int64_t bytes) {
  buffer_cache::limit.store(bytes > 0 ? static_cast<size_t>(bytes) : 0);
  buffer_cache::drop_all();  // (blocks kept under the old limit go; the next calls keep them again)
}

int64_t kiln_buffer_cache_kept(void) {
  auto& s = buffer_cache::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return static_cast<int64_t>(s.kept);
}

int64_t kiln_buffer_arena_bytes(void) {
  auto& s = buffer_cache::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return static_cast<int64_t>(s.arena.used);
}

void kiln_set_huge_pages(int on) {
  huge_pages_on.store(on != 0);
  // One-row products over panels on 2 MB pages read fewer runs a thread (kiln_gemm.h
  // `huge_page_packs`: faster on AMD's Zen 4 and Zen 5; on an Intel Xeon with AMX, family 6 model
  // 167, 1.02-1.04x the time of its runs over the same pages: docs/gemm.md).
  __builtin_cpu_init();  // (this also runs as the library loads, maybe before libgcc's own init)
  kiln_gemm_set_huge_page_packs(on && transparent_huge_pages() && __builtin_cpu_is("amd"));
  // Float32's and bfloat16 pairs' one-row products over them on Intel: two runs a thread asked for into L1 (kiln_gemm.h `near_gemv`).
  kiln_gemm_set_near_gemv(on && transparent_huge_pages() && __builtin_cpu_is("intel"));
}

const char* kiln_error(void) { return last_error.c_str(); }

void kiln_set_error(const char* message) { last_error = message; }

}  // extern "C"

namespace {
// The default (packs on 2 MB pages) handed to the kernels as the library loads: hosts that never
// call kiln_set_huge_pages — kiln-run and an exported model's library (kiln/deploy) — read one-row
// products as the packs' pages want too. Python's libkiln then hands over backend.huge_pages.
const bool huge_pages_by_default = (kiln_set_huge_pages(1), true);
}  // namespace
