"""Drive a real Aerie from outside: the harness the end-to-end tests and the benches share.

`control_plane.ControlPlane` runs `aerie up` and the CLI as subprocesses, `jobs` writes job specs
for the tiny trainer and reads what its ranks recorded, and `chaos` runs the fault schedule of
tests/chaos and bench/chaos.py. Nothing here is imported by the control plane itself.
"""
