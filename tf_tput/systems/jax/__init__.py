"""JAX: its runtime and every system built on it, one folder.

runtime.py is JAX's Runtime (tf_tput.runtime.Runtime): devices, jax.distributed for
launched processes, the peak probe and the compilation cache. system.py defines
--system=jax's SYSTEM, which picks a trainer: trainer.py (SPMD over one mesh),
pipeline.py (GPipe over a 'stage' axis) or islands.py (data parallel across
islands), all training model.py. pathways/ is --system=pathways, the same trainers
on Pathways on Cloud. Importing a system.py or runtime.py imports no JAX; they load
it, and the trainers, when their system is chosen.
"""
