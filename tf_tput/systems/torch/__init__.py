"""PyTorch: its runtime and every system built on it, one folder.

runtime.py is PyTorch's Runtime (tf_tput.runtime.Runtime): devices, torch.distributed
for launched processes and the peak probe. system.py defines --system=torch's
SYSTEM; trainer.py trains model.py, one replica per process. ray/ is --system=ray,
torch replicas as Ray actors driven by one controller. Importing a system.py or
runtime.py imports no torch; they load it, and the trainers, when their system is
chosen.
"""
