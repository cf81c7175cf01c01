"""The torch-free checkpoint kernel shared by the trainer, the agent, the handlers and the control plane.

- `storage`: `open_store(uri)` (S3 or a local directory: list, stat, read, write, delete),
  `join_uri`, `local_path`.
- `manifest`: a checkpoint's manifest (its objects, sizes, checksums), `commit`, `verify`,
  `list_checkpoints`, `last_good`, `checkpoint_uri`.
- `gc`: retention (`prune`: keep the last N, every Kth, and what is protected or recorded);
  also a CLI, `python -m aerie_checkpoint.gc`.
- `fence`: the fenced commit (`CommitGate`: ask the control plane, write the manifest, record it),
  so a superseded attempt's checkpoint never counts.

It imports no torch and nothing of `trainer/` or `agent/`: only `aerie_contracts`, `aerie_s3`
and `aerie_client`. The torch side (DCP save/load, S3 readers/writers) stays in `trainer.checkpoint`.
"""
