"""What makes a scheduler run without a GPU: the simulated model runner, synthetic and JSONL
workloads, and the driver that feeds a workload through an assembly on a virtual clock."""
