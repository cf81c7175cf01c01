"""Peak FLOP/s per device and on-demand instance prices: the denominators of MFU and tokens/$.

Both are overridable in the training config (`peak_flops`, `price_per_hour`) because tables go
stale and clouds differ. The numbers here:

- GPUs: dense (no sparsity) BF16 tensor-core peak from NVIDIA's data sheets (H100 SXM 989.4
  TFLOP/s, H100 PCIe 756, H200 989.4 (same compute as H100 SXM), A100 312, L40S 362, L4 121).
- AWS Trainium: per chip, BF16 (trn1: 190 TFLOP/s, i.e. 3,040 for the 16 chips of trn1.32xlarge;
  trn2: 667).
- CPU: no data sheet to read, so an estimate of the theoretical FP32 peak of the threads torch
  uses: threads x clock x FLOPs per cycle per core from the vector ISA (AVX-512: 64, AVX2+FMA: 32,
  else 8; two FMA pipes assumed), clock from /proc/cpuinfo (else 2.5 GHz). It is an upper bound, so
  a CPU's MFU is, if anything, understated. Useful for comparing runs on one machine, not across.
  With `precision: bf16` the matmuls run in BF16, so the peak is the BF16 one: AMX 1,024 FLOPs per
  cycle per core (Intel's figure for Sapphire Rapids' tile unit), AVX-512-BF16 twice the FP32 rate.
- Prices: AWS on-demand, Linux, us-east-1, USD per instance-hour, list prices as of 2024 (AWS cut
  P4/P5 prices in 2025: set `price_per_hour` for the price you pay). A `ml.` prefix (SageMaker
  instance names) maps to the EC2 price, which understates SageMaker's markup.
"""

from __future__ import annotations

import os
import re

PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989.4e12,
    "H100 PCIe": 756e12,
    "H100": 989.4e12,  # SXM; matched after the PCIe entry
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "trn1": 190e12,
    "trn2": 667e12,
}

INSTANCE_PRICE_PER_HOUR: dict[str, float] = {
    "p5.48xlarge": 98.32,
    "p5e.48xlarge": 108.15,
    "p4de.24xlarge": 40.97,
    "p4d.24xlarge": 32.77,
    "trn1.32xlarge": 21.50,
    "trn1n.32xlarge": 24.78,
    "trn1.2xlarge": 1.34,
    "g6e.48xlarge": 30.13,
    "g5.48xlarge": 16.29,
    "g5.xlarge": 1.01,
    "c7i.xlarge": 0.1785,
    "m7i.xlarge": 0.2016,
    "c5.xlarge": 0.17,
}


def instance_price(instance_type: str | None, override: float | None = None) -> float | None:
    """USD per instance-hour, or None when unknown (then tokens/$ is not reported)."""
    if override is not None:
        return override
    if not instance_type:
        return None
    name = instance_type.removeprefix("ml.")
    return INSTANCE_PRICE_PER_HOUR.get(name)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_bf16_unit() -> str | None:
    """What runs bf16 matmuls on this CPU: "amx_bf16", "avx512_bf16", or None (emulated)."""
    flags = _cpu_flags()
    return next((unit for unit in ("amx_bf16", "avx512_bf16") if unit in flags), None)


def _cpu_flops_per_cycle(bf16: bool = False) -> int:
    flags = _cpu_flags()
    unit = cpu_bf16_unit() if bf16 else None
    if unit == "amx_bf16":
        return 1024
    if unit == "avx512_bf16":
        return 128
    if "avx512f" in flags:
        return 64
    if {"avx2", "fma"} <= flags:
        return 32
    return 8


def _cpu_hz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", f.read())]
        if mhz:
            return max(mhz) * 1e6
    except OSError:
        pass
    return 2.5e9


def cpu_peak_flops(threads: int | None = None, bf16: bool = False) -> float:
    """Estimated FP32 (or, with `bf16`, BF16) peak of `threads` cores (default: torch's thread
    count, else 1); see module doc."""
    if threads is None:
        try:
            import torch

            threads = torch.get_num_threads()
        except ImportError:
            threads = 1
    return threads * _cpu_hz() * _cpu_flops_per_cycle(bf16)


def device_peak_flops(device_name: str | None, override: float | None = None, bf16: bool = False) -> float:
    """Peak FLOP/s of one rank's device. `device_name`: torch.cuda.get_device_name(), 'trn1', or
    None for CPU, whose peak depends on whether the matmuls run in BF16 (`bf16`)."""
    if override is not None:
        return override
    if device_name:
        for key, flops in PEAK_BF16_FLOPS.items():
            if key.lower() in device_name.lower():
                return flops
    return cpu_peak_flops(bf16=bf16)


def tokens_per_dollar(tokens_per_s: float, price_per_hour: float | None, num_instances: int) -> float | None:
    """Tokens one dollar buys at this throughput (all instances of the run paid for)."""
    if not price_per_hour or num_instances < 1:
        return None
    return tokens_per_s * 3600.0 / (price_per_hour * num_instances)


def num_instances(world_size: int, local_world_size: int | None = None) -> int:
    local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, world_size // max(1, local))
