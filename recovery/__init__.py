"""What happens after a failure, decided in one place.

A failed attempt goes through four questions, each a module here, and the answer is one
`Decision` (`policy.next_step`) that a handler carries out with one API call:

1. **classify** (`classify`, `nan_replay`): is it retried at all? A user's error, an exit code the
   spec marks non-retryable, a NaN that recurs at the same step after a deterministic resume: no.
2. **attribute** (`blame`): which node, if any, caused it, from the evidence the nodes reported.
3. **budget** (`budget`): restarts left (`retry.max_restarts`), and the nodes the next attempt
   leaves out (blamed `retry.exclude_after_blames` times).
4. **choose** (`modes`, `strategies`): in place, a hot spare in the failed node's slot, or a
   relaunch without the excluded nodes — the first strategy of the registry that takes it — and
   where to resume (`resume`: the newest good checkpoint that survives that choice).

The control plane asks `modes` the questions it must answer before chaining has decided (keep a
failed attempt's agents up? does the memory tier run?), so the answers cannot disagree.

Standard library only: it ships in the Lambda bundle beside `lambdas/` and `aerie_contracts/`.
The words it writes (modes, cause keys, failure kinds) are `aerie_contracts`'.
"""
