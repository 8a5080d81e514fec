"""What runs before serving: FA4's environment and disk cache, the kernel variants a loaded
vision model will hit, their warmup, and the JIT monitor."""
