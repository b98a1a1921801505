"""TensorFlow: its runtime and every system built on it, one folder.

runtime.py is the Runtime (tf_tput.runtime.Runtime) mtf and tf2 share: devices per
--strategy, the peak probe, the barrier and the worker servers, helped by cluster.py
(TF_CONFIG checks), workers.py and server.py (the worker servers tf_tput.launch
--num_workers starts), tpu.py (Cloud TPU systems) and trace.py (--trace_dir). Each
system is a folder here whose system.py defines SYSTEM: mtf/ (Mesh TensorFlow, the
paper's baseline) and tf2/ (tf.distribute strategies). Importing any of them imports
no TensorFlow: a module loads it when its system is chosen.
"""
