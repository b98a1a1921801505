"""--strategy=tpu's flags, checked before any framework starts: the Cloud TPU's address
(--tpu, --tpu_zone, --gcp_project) and the generation --tpu_type names. Connecting is
the framework's (tf_tput/systems/tensorflow/tpu.py). NOT exercised by CI or on this
project's machines (they have no TPU).
"""

import dataclasses
import re
from typing import Optional

from tf_tput.errors import UsageError

TPU_MASTER = re.compile(r"^grpc://[^:/]+:\d+$")


@dataclasses.dataclass(frozen=True)
class TpuAddress:
  name: str                  # a Cloud TPU's name, grpc://host:port, or "local" (TPU VM)
  zone: Optional[str] = None
  project: Optional[str] = None


def address_from_flags(tpu, tpu_zone, gcp_project) -> TpuAddress:
  """Checks --tpu / --tpu_zone / --gcp_project before TensorFlow starts."""
  if not tpu:
    raise UsageError("--strategy=tpu needs --tpu: the Cloud TPU's name (with "
                     "--tpu_zone/--gcp_project when not this VM's), grpc://HOST:8470, or "
                     "local on a TPU VM")
  if tpu.startswith("grpc://"):
    if not TPU_MASTER.match(tpu):
      raise UsageError(f"--tpu={tpu} is not grpc://HOST:PORT; e.g. grpc://10.0.0.2:8470")
    if tpu_zone or gcp_project:
      raise UsageError(f"--tpu={tpu} is an address already; --tpu_zone and "
                       "--gcp_project only qualify a TPU name")
  return TpuAddress(tpu, tpu_zone, gcp_project)


def kind_from_type(tpu_type: str) -> str:
  """--tpu_type (v3, v4, v5e, ... or an accelerator type such as v3-32) -> the device
  kind the peak table knows ("TPU v3"), checked before any framework starts."""
  from tf_tput.measure import peak
  known = sorted(key[len("tpu_"):] for key, _ in peak.PEAK_FLOPS if key.startswith("tpu_"))
  generation = tpu_type.lower().split("-")[0]
  if generation not in known:
    raise UsageError(f"--tpu_type={tpu_type} is not a TPU generation the peak table "
                     f"knows; use one of {', '.join(known)}")
  return f"TPU {generation}"
