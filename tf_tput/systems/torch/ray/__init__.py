"""--system=ray: a single controller driving torch replicas as Ray actors.

system.py is the System; runtime.py its Runtime (a Ray cluster, torch's peak probe);
cluster.py starts and stops a Ray cluster and joins its actors' gloo group (shared
with the Ray micro-benchmark); trainer.py creates the actors, each holding torch's
trainer, and dispatches each step to them; auth.py checks the token a joined
cluster asks for.
"""
