"""TensorFlow: its runtime and every system built on it, one folder.

runtime.py is the Runtime (tf_tput.runtime.Runtime) mtf and tf2 share: devices per
--strategy, the peak probe, the barrier and the worker servers, helped by cluster.py
(TF_CONFIG checks), workers.py and server.py (the worker servers tf_tput.launch
--num_workers starts), tpu.py (a Cloud TPU, --strategy=tpu) and trace.py (one step's
trace, --trace_dir). Each system is a folder here whose system.py defines SYSTEM:
mtf/ (Mesh TensorFlow, the paper's baseline) and tf2/ (tf.distribute strategies).
Importing a system.py or runtime.py imports no TensorFlow; they load it, and the
trainers, when their system is chosen.
"""
