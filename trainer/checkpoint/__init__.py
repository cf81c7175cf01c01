"""Checkpoint plane: DCP save/load (torch), S3 I/O, and the torch-free manifest."""
