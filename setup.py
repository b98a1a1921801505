"""tf_tput: training-throughput benchmarks of distributed ML systems (Pathways, MLSys 2022).

Install for development with `pip install -e ".[test,jax,ray,pathways]"`;
scripts/bench.sh and scripts/test.sh do it for you in .venv. The gin files (gin/:
models, mesh, pipeline, suites) go into the package as tf_tput/gin/, so a plain
`pip install .` or a wheel ships them too (tests/e2e/test_wheel_install.py builds
and installs one).
"""

from setuptools import find_packages, setup

ABSL = "absl-py>=2.0,<3"
GIN = "gin-config>=0.5,<0.6"
OPTAX = "optax>=0.2.4,<0.3"

setup(
    name="tf_tput",
    version="0.1.0",
    description="Comparative training-throughput benchmarks: Mesh TensorFlow baseline "
                "and other systems on the same gin-configured models",
    # gin/ (the checkout's top level) becomes tf_tput/gin/ in the wheel: a package
    # without __init__.py whose files are its data; tf_tput/__init__.py finds either.
    packages=find_packages(include=["tf_tput", "tf_tput.*"]) + ["tf_tput.gin"],
    package_dir={"tf_tput.gin": "gin"},
    package_data={"tf_tput.gin": ["*/*.gin"]},
    python_requires=">=3.10,<3.13",
    install_requires=[
        # tensorflow-cpu: CI and these machines have no accelerator. On a GPU host,
        # `pip uninstall tensorflow-cpu && pip install "tensorflow[and-cuda]"` after
        # installing tf_tput (both packages provide the same `tensorflow` module).
        "tensorflow-cpu>=2.16,<2.22",
        "mesh-tensorflow==0.1.21",    # last release; tf_tput/compat makes it import
        GIN,
        ABSL,
        "numpy>=1.26,<3",
        # TensorFlow's and JAX's dtypes. 0.7.0 takes 0.5 s to import here (it adds its
        # ufunc loops one by one, each a linear search), 0.6.0 0.08 s; every TF or
        # JAX process pays it, and a test run starts about a hundred.
        "ml_dtypes>=0.5.1,<0.7",
        "tensorboard>=2.16,<2.22",
        "tensorflow-datasets>=4.9,<4.10",
        "matplotlib>=3.10,<4",        # tf_tput.report's PNG plots (Agg backend, no display)
    ],
    extras_require={
        # filelock: JAX locks its persistent compilation cache's entries with it, so
        # launched processes sharing the cache never read a half-written one.
        "jax": ["jax>=0.4.35,<0.11", OPTAX, "filelock>=3.12,<5"],
        # The Ray micro-benchmark (actors + torch.distributed gloo). torch 2.13.0 is
        # the CPU build on these machines' disk; a plain `torch` pulls a CUDA build.
        "ray": ["ray>=2.9,<3", "torch==2.13.0"],
        # --system=torch (the same pin: the CPU build on these machines' disk).
        "torch": ["torch==2.13.0"],
        # AMD's ZenDNN for torch: one more GEMM path the probe may choose on AMD CPUs
        # (docs/systems.md, "GEMM paths"); the release built for torch 2.13, without
        # its dependencies' pins (it asks for a plain `torch`).
        "zentorch": ["zentorch==2.13.0.2; platform_machine == 'x86_64'", "torch==2.13.0",
                     "deprecated", "safetensors"],
        # scripts/hf_t5_reference.py: Hugging Face's T5 in PyTorch, the speed reference
        # --system=torch is compared with (docs/systems.md); no test needs it.
        "compare": ["transformers>=5,<6", "torch==2.13.0"],
        # --system=pathways: JAX as a client of a Pathways on Cloud cluster. pathwaysutils
        # 0.1.13 (the version checked here, up to the connection) needs jax >= 0.10.
        "pathways": ["pathwaysutils>=0.1.13,<0.2", "jax>=0.10,<0.11", OPTAX],
        # scripts/gpu.sh: what jax's and torch's runs need beside a GPU machine's own
        # CUDA builds of jax and torch, all pure Python; it installs those missing,
        # without their dependencies, so that nothing replaces those builds.
        "gpu": [ABSL, GIN, OPTAX],
        # pytest-xdist: scripts/test.sh runs the suite in up to 4 workers; ruff: its
        # lint first (scripts/lint.sh).
        "test": ["pytest>=7,<9", "psutil>=5.9,<8", "pytest-xdist>=3.5,<4",
                 "ruff>=0.8,<1"],
    },
)
