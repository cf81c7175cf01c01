"""The tests' one way to wait for something in another process or thread: the harness's."""

from devtools.harness.wait import wait_for

__all__ = ["wait_for"]
