"""The fleet collector: agents' reports, events and command results into SQLite.

``Store`` is the database (the ``store`` package). The collector process is
``transport.py`` (the ZeroMQ CURVE server: sockets, acks, heartbeats, commands),
``fleet.py`` (what a message does: store, automation, checkpoints, Slurm polling) and
``app.py``, where ``build_collector`` puts them together.
"""
