"""tf_tput: training-throughput benchmarks of distributed ML systems (Pathways, MLSys 2022).

Importing the package imports no ML framework: configuration, validation and model
arithmetic run before TensorFlow or JAX start.
"""
import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# The directory that holds the package: the repository root in a source checkout
# (git provenance reads it), site-packages when installed (not a git checkout then).
REPO_ROOT = PACKAGE_DIR.parent
# The gin files (models, mesh, pipeline, suites): gin/ at the checkout's top level;
# setup.py ships that folder inside the package as tf_tput/gin/, where an installed
# copy finds it. The package's own is looked at first: beside an installed package,
# site-packages/gin is gin-config.
GIN_DIR = next((d for d in (PACKAGE_DIR / "gin", REPO_ROOT / "gin")
                if (d / "models").is_dir()), REPO_ROOT / "gin")
# The directory gin/ is in: `gin/models/t5_small.gin` (the form suites and gin
# `include` lines use) resolves against it from any working directory.
GIN_PARENT = GIN_DIR.parent
