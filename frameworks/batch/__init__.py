"""The batch framework: a persistent job queue on Agora (``agora batch …``).

Built on :mod:`agora.sdk` alone: a framework scheduler (the *batch service*) keeps jobs in
SQLite, schedules their tasks on the offers it receives (priority, fair share, backfill), and
serves an HTTP API that the ``agora batch`` commands use.
"""
