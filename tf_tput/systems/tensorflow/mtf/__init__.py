"""--system=mtf: Mesh TensorFlow in one TF1 Session, the paper's TensorFlow baseline.

system.py is the System; model.py builds the graph every trainer trains; trainer.py
(one Session), pipeline.py (GPipe stages), islands.py (a hierarchical reduction
across islands) and tpu.py (Cloud TPU) train it. mtf's numerics that need no
framework, which the JAX, TF2 and PyTorch twins of the model share, are
tf_tput/numerics.py's.
"""
