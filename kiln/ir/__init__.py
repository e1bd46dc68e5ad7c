"""The data that passes between kiln's stages, importable by every stage (it imports none):

- the loop-level IR: define-by-run nodes whose bodies call `ops.*` (nodes.py, ops.py), the
  analyses and reference evaluator over the same protocol (analysis.py, evaluate.py), the verifier
  (verify.py), index algebra (indexing.py, index_bounds.py);
- a lowered graph: `Program` and its `ComputeStep`s and `ExternStep`s (program.py);
- a scheduled graph: `Schedule`, its `FusedKernel`s of `LoopNest`s, its `MemoryPlan` (schedule.py);
- what freezing and the passes hand on: node-meta keys (graph_meta.py), the `ConstantSplit`
  (constant_split.py), the `Target` a graph is compiled for (target.py).
"""
