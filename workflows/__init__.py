"""Durable Temporal workflows: the user-workflow shell (``workflows.shell``), the gang of one distributed task
call (``workflows.gang``), the Scheduler (``workflows.scheduler``) and map chunks (``workflows.mapping``).

Nothing is imported here: the worker (``engine.runtime.worker``) imports the workflow classes it registers,
and importing one module of this package does not load the others. The names they share with the client and
the node agents are in ``engine.core.protocol``.
"""
