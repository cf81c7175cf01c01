"""Which GPUs this node's ranks may use, from the variables CUDA and the container runtime read.

`CUDA_VISIBLE_DEVICES` (what CUDA in the ranks obeys) wins over `NVIDIA_VISIBLE_DEVICES` (what the
NVIDIA container runtime mounted); unset, every GPU is visible. Entries are indices (`0,1`), GPU
UUIDs (`GPU-8f3c…`, a unique prefix is enough, as for CUDA) or MIG devices (`MIG-<uuid>`, or the
older `MIG-GPU-<uuid>/<gi>/<ci>`, which name their parent GPU). CUDA's indices follow NVML's when
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, and on the uniform GPUs of a training node in the default order
too (ties in "fastest first" are broken by PCI bus id). Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

CUDA = "CUDA_VISIBLE_DEVICES"
NVIDIA = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Visible:
    """The visible-device list in force: `tokens` None means every device (unset or `all`)."""

    tokens: tuple[str, ...] | None
    source: str  # the variable it came from, or "" when none restricts

    @property
    def everything(self) -> bool:
        return self.tokens is None

    def count(self) -> int | None:
        """How many devices the list names (None: every device, count unknown without NVML)."""
        return None if self.tokens is None else len(self.tokens)

    def pick(self, devices: list[tuple[int, str | None, tuple[str, ...]]]) -> list[int]:
        """The NVML indices of `devices` ((index, uuid, MIG uuids) each) that the list names.

        `NVIDIA_VISIBLE_DEVICES` is applied by the container runtime, not by CUDA: inside a
        container NVML already sees only the devices it names, renumbered from 0, so when NVML sees
        no more devices than the list names, all of them are the visible ones."""
        if self.source == NVIDIA and self.tokens is not None and len(devices) <= len(self.tokens):
            return [d[0] for d in devices]
        return [i for i, uuid, migs in devices if self.selects(i, uuid, migs)]

    def selects(self, index: int, uuid: str | None, mig_uuids: tuple[str, ...] = ()) -> bool:
        """Whether the GPU with NVML `index` and `uuid` (and MIG devices `mig_uuids`) is named."""
        if self.tokens is None:
            return True
        for token in self.tokens:
            if token.isdigit() and int(token) == index:
                return True
            if token.startswith("MIG-GPU-"):  # CUDA 11.0's form: MIG-GPU-<parent uuid>/<gi>/<ci>
                if uuid and _same_uuid(token[len("MIG-") :].split("/", 1)[0], uuid):
                    return True
            elif token.startswith("MIG-"):
                if any(_same_uuid(token, m) for m in mig_uuids):
                    return True
            elif token.startswith("GPU-") and uuid and _same_uuid(token, uuid):
                return True
        return False


def visible(env: Mapping[str, str] | None = None) -> Visible:
    env = os.environ if env is None else env
    for name in (CUDA, NVIDIA):
        if name not in env:
            continue
        raw = env[name].strip()
        if name == NVIDIA and raw.lower() == "all":
            return Visible(None, "")
        if raw.lower() in ("", "none", "void", "nodevfiles") or raw == "-1":
            return Visible((), name)
        tokens = []
        for token in (t.strip() for t in raw.split(",")):
            if not token or token == "-1" or token.startswith("-"):
                break  # CUDA ignores everything from the first invalid entry on
            tokens.append(token)
        return Visible(tuple(tokens), name)
    return Visible(None, "")


def visible_gpu_count(env: Mapping[str, str] | None = None) -> int:
    """`SM_NUM_GPUS`: the devices the list names, else what NVML sees, else 0."""
    count = visible(env).count()
    if count is not None:
        return count
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no GPU
        return 0


def _same_uuid(token: str, uuid: str) -> bool:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    return bool(token) and uuid.lower().startswith(token.lower())
