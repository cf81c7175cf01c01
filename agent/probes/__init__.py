"""Probes: each samples one source (accelerators, NICs, the metrics stream) into ring buffers."""
