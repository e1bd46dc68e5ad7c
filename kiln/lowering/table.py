"""Importing this module fills the lowering table: one import per module of lowerings."""

from kiln.lowering import pointwise, reductions, views  # noqa: F401
