"""A run above the container: the driver that feeds a workload through an assembly on the
model runner's clock, the summary of a run and its plots."""
