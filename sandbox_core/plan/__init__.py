"""All or nothing across sandboxes: the plan commit (seed 002, "Atomic Commit").

``journal`` (the durable record of an attempt), ``saga`` (commit one by one, compensate in LIFO
order), ``two_phase`` (prepare every participant, then decide), ``review`` (what a plan would
change, and its digest) and ``commit`` (the one ``commit_plan()``: mode, fallback, approval).
The plan knows no strategy: its participants are the Protocol of ``participants``. It imports
only the core's vocabulary (errors, status, protocol, durable) and its own modules.
"""
