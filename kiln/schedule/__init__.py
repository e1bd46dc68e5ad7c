"""The scheduler: a lowered Program's compute nodes grouped into fused kernels, with a memory plan.

    schedule(program) -> Schedule   (dead nodes removed, nodes fused, loop order chosen, buffers planned)
"""

from kiln.schedule.scheduler import schedule  # noqa: F401
