"""ATen graph -> ATen graph passes, each pure and named, run in the order `pipeline.PASSES` lists."""

from kiln.passes.pipeline import PASSES, run_passes  # noqa: F401
