"""Keys kiln writes into `fx.Node.meta` in one stage for a later stage to read.

- `MODULE_STATE`: on a placeholder of an inference graph, set by the AOT layer
  (kiln/aot/module_state.py): the input is a parameter or buffer of the user's module that the
  graph does not mutate. Freezing (kiln/passes/freeze.py) may then treat it as a constant.
- `WRITTEN_BACK_FROM`: on a placeholder of an inference graph, set by the AOT layer
  (kiln/aot/signature.py `mark_written_back`): the graph mutates this input; its new value is the
  graph's flat output at this position, which the AOT layer copies back into the input after each
  call. The backend may compute that output in the input's own memory (kiln/schedule/memory.py):
  the copy back is then of a tensor onto itself, which `copy_` skips.
"""

MODULE_STATE = "kiln_module_state"
WRITTEN_BACK_FROM = "kiln_written_back_from"
