"""--system=tf2: the same model in TensorFlow 2 under tf.distribute strategies.

system.py is the System and its trainer; model.py the model, a port of jax/model.py.
"""
