// kiln's runtime interface: what a generated C++ wrapper (kiln/codegen/cpp_wrapper.py) calls for
// everything that is not one of its kernels -- tensors (allocation, layout, data) and ATen
// operators -- as plain C functions over opaque handles. Only kiln_runtime.cpp includes libtorch's
// headers; a wrapper includes this one, so it compiles as fast as a kernel does.
//
// A handle (kiln_tensor) is an owned at::Tensor*: whoever holds it releases it once. Functions
// that can fail return non-zero and leave the message for kiln_error(); no C++ exception crosses
// this interface.
#pragma once
#include <stdint.h>

// The runtime is built with hidden visibility and loaded with its symbols global: only these
// functions are exported, so the definitions it shares with kernel libraries (kiln_index_error,
// from kiln's GEMM unit) never stand in for theirs.
#define KILN_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

typedef void* kiln_tensor;

// What an operator argument is; `kiln_arg` holds it in `i`, `d` or `p`/`n`.
enum kiln_arg_kind {
  KILN_NONE = 0,
  KILN_TENSOR = 1,    // p: kiln_tensor (borrowed)
  KILN_INT = 2,       // i
  KILN_DOUBLE = 3,    // d
  KILN_BOOL = 4,      // i
  KILN_STRING = 5,    // p: const char*
  KILN_DTYPE = 6,     // i: c10::ScalarType
  KILN_LAYOUT = 7,    // i: c10::Layout
  KILN_MEMORY_FORMAT = 8,  // i: c10::MemoryFormat
  KILN_DEVICE = 9,    // i: c10::DeviceType, n: index (-1: none)
  KILN_LIST = 10,     // p: const kiln_arg*, n elements; typed by the operator's schema
};

typedef struct kiln_arg {
  int32_t kind;
  int64_t i;
  double d;
  const void* p;
  int64_t n;
} kiln_arg;

KILN_API kiln_tensor kiln_empty_strided(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype);
// Another handle to the same tensor (for two names of one buffer).
KILN_API kiln_tensor kiln_share(kiln_tensor t);
KILN_API void kiln_release(kiln_tensor t);
// An alias of t's memory with this layout (a graph's view op whose result is not a graph output).
KILN_API kiln_tensor kiln_reinterpret(kiln_tensor t, int64_t ndim, const int64_t* sizes, const int64_t* strides, int64_t offset);
KILN_API void* kiln_data(kiln_tensor t);
KILN_API int64_t kiln_size(kiln_tensor t, int64_t dim);
// *t copied into this layout when its strides differ (the kernels were generated for them).
KILN_API int kiln_in_layout(kiln_tensor* t, int64_t ndim, const int64_t* sizes, const int64_t* strides);
// An operator by qualified name ("aten::mm") and overload ("" for default): one of kiln's own that
// the runtime defines (kiln::mm, kiln::conv, ...; kiln_runtime.cpp KILN_OPERATOR), called directly, else the
// dispatcher's; NULL with the error set when there is none.
KILN_API void* kiln_find_op(const char* name, const char* overload);
// Calls `op` with every argument of its schema in order; its results, flattened (a list result
// gives one handle per element, a None result a NULL handle), go to `outs` (at most `nouts`).
KILN_API int kiln_call_op(void* op, const kiln_arg* args, int64_t nargs, kiln_tensor* outs, int64_t nouts);
// Packed weights the runtime holds (those of freed weights are dropped at the next pack).
KILN_API int64_t kiln_packs_held(void);
// Drop every packed form held for `weight` (the autotuner's trial weights, once a question is
// answered: a pack otherwise stays until the next pack after its weight is freed).
KILN_API void kiln_drop_packs(kiln_tensor weight);
// Bytes of the packed forms held for `weight` now (views of its own memory not counted).
KILN_API int64_t kiln_packed_bytes(kiln_tensor weight);
// float32 lanes of the vectors kiln's kernels were built with (kiln::attention's v head size must
// be a multiple of them).
KILN_API int kiln_vector_lanes(void);
// Whether packs made from now on are carved from memory advised as 2 MB pages (1, the default) or
// come from PyTorch's allocator (0): the setting backend.huge_pages (kiln_runtime.cpp).
KILN_API void kiln_set_huge_pages(int on);
// Whether kiln's one-row products read their panels as 2 MB pages want (fewer runs a thread: set
// with the setting above where the CPU is AMD and THP is on; kiln_gemm.h `huge_page_packs`).
KILN_API int kiln_huge_page_reads(void);
// Bytes of freed blocks the runtime keeps for the tensors it makes itself (the setting
// runtime.buffer_cache_mb; 0: none kept, each from c10's CPU allocator); blocks kept before go.
KILN_API void kiln_set_buffer_cache(int64_t bytes);
// Bytes of freed blocks kept now.
KILN_API int64_t kiln_buffer_cache_kept(void);
// Bytes carved so far from the blocks' arena of 2 MB pages (backend.huge_pages; 0: none, or off).
KILN_API int64_t kiln_buffer_arena_bytes(void);
// The threads kiln's next parallel region asks for (src/kiln_team.cpp): OpenMP's count, less those
// taken off while the calling thread waits for busy cores. kiln_set_adaptive_team is the setting
// runtime.adaptive_team; kiln_team_cut the threads taken off now, kiln_team_narrowings the times
// one was, kiln_team_asks the regions that asked; (tests) kiln_team_force_cut takes threads off
// as busy checks would, kiln_team_replay gives the policy's cut after each of n checks of a fresh
// policy.
KILN_API int kiln_team_threads(void);
KILN_API void kiln_set_adaptive_team(int on);
KILN_API int kiln_team_cut(void);
KILN_API int64_t kiln_team_narrowings(void);
KILN_API int64_t kiln_team_asks(void);
KILN_API void kiln_team_force_cut(int cut);
KILN_API void kiln_team_replay(int64_t n, const int64_t* now, const int32_t* busy, int32_t full, int32_t* cuts);
KILN_API const char* kiln_error(void);
KILN_API void kiln_set_error(const char* message);

#ifdef __cplusplus
}
#endif
