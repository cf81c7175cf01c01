"""Torch-free S3 I/O shared by the agent, the trainer and the handlers.

- `settings`: `S3Settings.from_env()` (endpoint, region, credentials, part sizes, connections),
  `parse_uri`, `is_s3`.
- `clients`: a boto3 client for control calls, and the AWS CRT client (s3torchconnectorclient's
  `MountpointS3Client`, which needs no torch) for data.
- `ranged`: the one parallel ranged-GET engine: byte ranges cut into equal slices, `connections`
  CRT GETs in flight, each slice written where the caller says (memory or a file). Checkpoint
  restores (`trainer.checkpoint.s3io`), channel downloads (`agent.channels`) and FastFile reads
  (`trainer.data.s3_indexed`) all go through it.
- `listing`, `verify`, `download`, `upload`: objects under a prefix, checksum verification,
  many objects to files, and a streaming parallel multipart upload.

Only the standard library is imported at module level; boto3 and the CRT are imported on use.
"""
