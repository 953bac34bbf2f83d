"""Active validation (`slurmgpu validate`, docs/validation.md): tests that prove a node
healthy by running it, each a real tool or the built-in probe in its own process group
under a hard timeout, its output parsed and judged into ``validate.<test>`` findings.

``runner`` runs commands hang-proof, ``parsers`` read the tools' outputs, ``catalog``
says what each test runs and how it is judged (``judge``, ``floors``), ``platform`` is
where the tools come from (this node, or the simulator's scenario), ``session`` runs a
tier within its budget, ``fleet`` finds stragglers and suggests thresholds from many
nodes' results. ``probe`` is the built-in GPU probe, run as a child process.
"""
