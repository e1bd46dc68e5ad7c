// How many threads each of kiln's parallel regions asks OpenMP for: kiln::team(). Every region in
// kiln's C++ (its GEMM, attention, depthwise convolution and the generated kernels) names it in a
// `num_threads` clause, so that the runtime's count (src/kiln_team.cpp) is the one place that sizes
// them. That count is OpenMP's own (the calling thread's, torch.set_num_threads's) except while
// the cores are busy with other work: a decode step is ~200 regions of tens of microseconds, each
// ended by a barrier that waits for its slowest thread, and beside one busy process on a 2-core
// machine a thread the scheduler took off costs its region a time slice (Qwen2-0.5B int4: 11 ms a
// token quiet, 108-332 ms beside it at 2 threads, 19 ms at 1).
//
// The runtime library defines `kiln_team_threads`; a kernel library finds it in the process's
// global scope where the runtime was loaded first (kiln/runtime/compiled_graph.py), and without it
// (a library loaded before the runtime was built) its regions take OpenMP's count.
#pragma once
#include <omp.h>

extern "C" __attribute__((weak, visibility("default"))) int kiln_team_threads(void);

namespace kiln {
static inline int team() { return kiln_team_threads ? kiln_team_threads() : omp_get_max_threads(); }
}  // namespace kiln
