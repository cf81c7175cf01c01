"""The tests' one way to wait for something in another process or thread: the harness's."""

from orchestrator.harness.wait import wait_for

__all__ = ["wait_for"]
