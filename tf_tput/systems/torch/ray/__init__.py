"""--system=ray: a single controller driving torch replicas as Ray actors.

system.py is the System; runtime.py its Runtime (a Ray cluster, torch's peak probe);
cluster.py starts the actors and joins them with torch.distributed (shared with the
Ray micro-benchmark); trainer.py dispatches each step to them.
"""
