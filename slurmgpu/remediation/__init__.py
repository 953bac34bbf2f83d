"""Return to service (issue 32): the remediation ladder of a node slurmgpu drained
(``ladder``: pure, typed, JSON-serialisable), its steps and events (``steps``), the
repair ticket (``ticket``) and the runner of ``[remediation] repair_command``
(``repair``). The collector carries the steps out; docs/remediation.md describes it all.
"""
