"""Keys kiln writes into `fx.Node.meta` in one stage for a later stage to read.

- `MODULE_STATE`: on a placeholder of an inference graph, set by the AOT layer
  (kiln/aot/module_state.py): the input is a parameter or buffer of the user's module that the
  graph does not mutate. Freezing (kiln/passes/freeze.py) may then treat it as a constant.
"""

MODULE_STATE = "kiln_module_state"
