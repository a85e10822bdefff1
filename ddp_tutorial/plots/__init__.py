"""Matplotlib drawings used by the notebooks, made from values the workers really returned.

Functions take an ``ax`` (or create a figure) and return it; they never call
``plt.show()``. ``comm``: collectives, the ring, bandwidth (lessons 02-06, 08);
``timelines``: overlap, bucket sweeps, pipelines (08, 10); ``sharding``: bytes per rank
(14); ``meshes``: which rank holds which block of a tensor (15), each rank's mesh
coordinates (22); ``saved_bytes``: saved bytes by op
and recomputation's trade-off (17); ``schedules``: pipeline
schedules, a lane per rank (19); ``workload``: causal attention's work per rank (20); ``experts``:
the tokens each rank sends each rank, the load per expert (21).
"""

from ddp_tutorial.plots.comm import (
                                     plot_allreduce_fit,
                                     plot_busbw,
                                     plot_collective,
                                     plot_ring_steps,
                                     plot_subgroups,
                                     plot_token_ring,
)
from ddp_tutorial.plots.experts import plot_expert_load, plot_token_matrix, token_matrix
from ddp_tutorial.plots.meshes import plot_rank_grid, plot_tensor_blocks
from ddp_tutorial.plots.saved_bytes import plot_recompute_tradeoff, plot_saved_by_op
from ddp_tutorial.plots.schedules import plot_schedule
from ddp_tutorial.plots.sharding import plot_bytes_per_rank
from ddp_tutorial.plots.timelines import (
                                     plot_bucket_sweep,
                                     plot_exposed,
                                     plot_link_steps,
                                     plot_overlap_timeline,
                                     plot_pipeline_timeline,
                                     plot_stage_grid,
)
from ddp_tutorial.plots.workload import plot_work_per_rank

__all__ = ["plot_collective", "plot_ring_steps", "plot_busbw", "plot_subgroups", "plot_token_ring",
           "plot_allreduce_fit", "plot_overlap_timeline", "plot_bucket_sweep", "plot_exposed", "plot_link_steps", "plot_pipeline_timeline",
           "plot_stage_grid", "plot_bytes_per_rank", "plot_tensor_blocks",
           "plot_saved_by_op", "plot_recompute_tradeoff", "plot_work_per_rank",
           "plot_token_matrix", "plot_expert_load", "token_matrix",
           "plot_schedule", "plot_rank_grid"]
