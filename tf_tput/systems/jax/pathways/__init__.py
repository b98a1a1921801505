"""--system=pathways: --system=jax's trainers on Pathways on Cloud.

system.py is the System (jax's, on another runtime); runtime.py connects JAX to the
Pathways proxy. Cloud TPU only, never run here.
"""
