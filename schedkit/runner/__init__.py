"""The simulated model runner: deterministic tokens, a step-time cost model on a virtual or
wall clock, presets for real models and GPUs, and the fit of its coefficients to measured step
times (``schedkit calibrate``)."""
