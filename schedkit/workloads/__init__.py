"""Workloads: synthetic generators (``chat``, ``shared-prefix``), arrival processes and the
trace formats a run or a fleet replays (Mooncake, Azure, BurstGPT, ShareGPT, JSONL). A new
trace format goes in ``trace_formats.py``."""
