"""Megatron's pretraining sampler: each data-parallel rank gets its slice of every global batch.

Sample indices run 0..total_samples-1 in order (the randomness lives in GPTDataset's shuffle
index), so the position in the data is just `consumed_samples`: a resumed run passes the count it
had consumed and continues with exactly the next micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class MegatronPretrainingSampler:
    """Yields one micro-batch (a list of sample indices) per iteration for one DP rank.

    The global stream is cut into chunks of `micro_batch_size * data_parallel_size` samples;
    rank r takes the r-th `micro_batch_size` slice of each chunk, so ranks never overlap and
    together cover every sample once. An incomplete last chunk is dropped unless
    `drop_last=False` (then it is sliced the same way, so later ranks may get less or nothing).

    `consumed_samples` counts samples of all ranks together: after `steps` optimizer steps of
    `grad_accum` micro-batches it is `steps * micro_batch_size * data_parallel_size * grad_accum`.
    `total_samples` is normally `len(GPTDataset)`.
    """

    total_samples: int
    consumed_samples: int
    micro_batch_size: int
    data_parallel_rank: int
    data_parallel_size: int
    drop_last: bool = True

    def __post_init__(self) -> None:
        if self.total_samples <= 0:
            raise ValueError(f"no sample to consume: total_samples={self.total_samples}")
        if self.consumed_samples >= self.total_samples:
            raise ValueError(
                f"no samples left: consumed_samples={self.consumed_samples} >= total_samples={self.total_samples}"
            )
        if self.micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {self.micro_batch_size}")
        if self.data_parallel_size <= 0:
            raise ValueError(f"data_parallel_size must be positive, got {self.data_parallel_size}")
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(f"data_parallel_rank {self.data_parallel_rank} not in [0, {self.data_parallel_size})")

    @property
    def micro_batch_times_dp(self) -> int:
        """Samples of one global batch (all ranks' micro-batches together)."""
        return self.micro_batch_size * self.data_parallel_size

    def __len__(self) -> int:
        """Micro-batches this rank will still yield."""
        remaining = self.total_samples - self.consumed_samples
        full, rest = divmod(remaining, self.micro_batch_times_dp)
        start, _ = self._slice()
        return full + (1 if not self.drop_last and rest > start else 0)

    def _slice(self) -> tuple[int, int]:
        """This rank's [start, end) inside each global batch (Megatron's get_start_end_idx)."""
        start = self.data_parallel_rank * self.micro_batch_size
        return start, start + self.micro_batch_size

    def __iter__(self) -> Iterator[list[int]]:
        start, end = self._slice()
        batch: list[int] = []
        for idx in range(self.consumed_samples, self.total_samples):
            batch.append(idx)
            if len(batch) == self.micro_batch_times_dp:
                yield batch[start:end]
                batch = []
        # The short last batch (drop_last=False) is sliced the same way; a rank whose slice is
        # empty yields nothing rather than an empty micro-batch.
        if batch and not self.drop_last and batch[start:end]:
            yield batch[start:end]
