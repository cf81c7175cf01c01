"""Aerie's control plane: job spec, store, API, controller, backends and CLI (torch-free)."""

__version__ = "0.1.0"
