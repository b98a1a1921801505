"""--system=pathways: the JAX adapter's trainers, driven as a single controller through
Pathways on Cloud (the paper's own system, as Google Cloud offers it).

The model, the sharding and the train step are --system=jax's (jax/system.py picks
the trainer); only the runtime differs: one process, the Pathways cluster's IFRT proxy
as JAX's backend, every chip of the cluster in one mesh
(runtime.py). Records say system "pathways", so a suite
sets it beside jax as the paper's Table 1 does. Needs the pathways extra and a
Pathways cluster; never run against one by tf_tput's own tests.
"""

from tf_tput.systems.jax import system as jax_system
from tf_tput.systems.jax.pathways import runtime as pathways_runtime


class PathwaysSystem(jax_system.JaxSystem):
  name = "pathways"
  runtime = pathways_runtime.RUNTIME
  distributions = {"jax": ("jax",), "pathwaysutils": ("pathwaysutils",)}
  multi_process = False  # one client drives every device of the cluster
  strategies = ("local",)  # the cluster's devices, seen as this process's own
  islands = ()  # tf_tput.launch --islands starts processes; a cluster's slices are
  # Pathways' own to join
  caveat = pathways_runtime.NEVER_RUN  # in every record it writes


SYSTEM = PathwaysSystem()
