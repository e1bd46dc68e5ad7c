"""kiln's loop-level IR: define-by-run nodes whose bodies call `ops.*` (see ops.py, nodes.py)."""
