"""Attention kernels and their dispatch; imports nothing from SGLang."""
