"""Importing this module fills the lowering table: one import per module of lowerings."""

from kiln.lowering import (  # noqa: F401
    bitwise, composite, creation, division, indexing, norms, pointwise, pooling, random, reductions, scatter, shape,
    softmax, special, views,
)
