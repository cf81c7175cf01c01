"""Input channels (SageMaker's InputDataConfig) as every side names them: the agent that delivers
them, the trainer's readers that find them (`trainer/data/channels.py`) and the control plane that
validates them. Here, not in the agent, so the trainer reads them without importing the agent."""

from __future__ import annotations

import re

FILE, FAST_FILE, PIPE = "File", "FastFile", "Pipe"  # TrainingInputMode
FULLY_REPLICATED, SHARDED_BY_S3_KEY = "FullyReplicated", "ShardedByS3Key"  # S3DataDistributionType
# Aerie's addition to SageMaker's SM_CHANNEL_<NAME>: the channel's S3 URI, for every S3 channel
# (the agent downloads File-mode channels from it; FastFile readers stream from it).
S3_URI_SUFFIX = "_S3_URI"


def env_name(channel: str) -> str:
    """`SM_CHANNEL_<this>`: the channel name upper-cased, anything but letters and digits as _."""
    return re.sub(r"[^A-Za-z0-9]", "_", channel).upper()
