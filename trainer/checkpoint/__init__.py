"""Checkpoint plane, the torch side: DCP save/load, S3 readers/writers, the memory tier.

The torch-free manifest, retention and fence are `aerie_checkpoint`'s.
"""
