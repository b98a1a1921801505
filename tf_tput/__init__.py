"""tf_tput: training-throughput benchmarks of distributed ML systems (Pathways, MLSys 2022).

Importing the package imports no ML framework: configuration, validation and model
arithmetic run before TensorFlow or JAX start.
"""
import pathlib

# gin/ lives beside the package in the source tree (installed with `pip install -e .`).
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
GIN_DIR = REPO_ROOT / "gin"
