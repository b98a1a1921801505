"""Where a run's devices and processes come from: device resolution per --strategy
(topology), TF_CONFIG clusters (cluster, tf_server, tf_workers), local processes on
loopback (processes) and Cloud TPU slices (tpu)."""
