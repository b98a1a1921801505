"""tf_tput: training-throughput benchmarks of distributed ML systems (Pathways, MLSys 2022).

Importing the package imports no ML framework: configuration, validation and model
arithmetic run before TensorFlow or JAX start.
"""
import pathlib

# The package's directory: its gin/ (models, mesh, pipeline, suites) ships inside it,
# installed or not, and `gin/models/t5_small.gin` (the form --gin_file, suites and gin
# `include` lines use) resolves against it from any working directory.
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
GIN_DIR = PACKAGE_DIR / "gin"
# The directory that holds the package: the repository root in a source checkout
# (git provenance reads it), site-packages when installed (not a git checkout then).
REPO_ROOT = PACKAGE_DIR.parent
