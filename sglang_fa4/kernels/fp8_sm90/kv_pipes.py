"""The K/V^T ring's barriers of the SM90 FP8 forward: one TMA pipeline for a stage's K and V^T
together (the default), or one each (switch ``kv_split``, persistent kernel).

Why split: with one barrier a stage is freed only when its PV GEMM is done, a key tile after its
QK^T, so the producer refills it one key tile ahead of its QK^T; Nsight Compute of the persistent
kernel (narrow first tiles, ``git show 244b9bd:benchmark/results/h200/fp8_attention_ncu_nokv.md``) has the consumers waiting on that barrier for
3.0% of all stall samples.
Split, the QK^T waits for K alone and frees it as soon as S is complete; V^T is waited for just
before the PV GEMM a key tile later and freed after it.  The producer still loads K_j, V^T_j, K_j+1,
...: K of a stage is free a key tile earlier, so K and V^T each get about two key tiles of lead.
Measured (fp8_attention_ncu_kvsplit.md): the consumers still wait 2.9% of the samples in all (1.3%
on K, 1.6% on V^T), and a 128x128 tile of work takes 2094 SM cycles against 2147.

Plain Python (calls the pipelines' own device operations, traced inline): without ``v`` every
method is what the one pipeline did before, and the split-only ones do nothing.
"""

from __future__ import annotations

from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values


class KvPipes:
    """``k``: the K/V^T pipeline (both behind its barrier), or K's alone when ``v`` is V^T's."""

    def __init__(self, k, v=None):
        self.k = k
        self.v = v

    # the DSL's value protocol, so a KvPipes can be carried through a runtime if / loop as the
    # pipelines themselves are
    def __extract_mlir_values__(self):
        return extract_mlir_values(self.k) + (extract_mlir_values(self.v) if self.v is not None else [])

    def __new_from_mlir_values__(self, values):
        n = len(extract_mlir_values(self.k))
        v = new_from_mlir_values(self.v, values[n:]) if self.v is not None else None
        return KvPipes(new_from_mlir_values(self.k, values[:n]), v)

    # ---- producer ----
    def producer_acquire(self, state):
        """Wait until the stage is free for K (and V^T, unsplit)."""
        self.k.producer_acquire(state)

    def producer_get_barrier(self, state):
        """The barrier K's TMA load completes on (unsplit: V^T's too)."""
        return self.k.producer_get_barrier(state)

    def acquire_v(self, state):
        """kv_split: wait until the stage is free for V^T."""
        if self.v is not None:
            self.v.producer_acquire(state)

    def v_barrier(self, state):
        """The barrier V^T's TMA load completes on."""
        return self._v_or_k().producer_get_barrier(state)

    # ---- consumers ----
    def consumer_wait(self, state):
        """Before a QK^T: K has arrived (unsplit: K and V^T)."""
        self.k.consumer_wait(state)

    def wait_v(self, state):
        """kv_split, before a PV GEMM: V^T has arrived."""
        if self.v is not None:
            self.v.consumer_wait(state)

    def release_k(self, state):
        """kv_split, once the QK^T is complete: K's buffer is free."""
        if self.v is not None:
            self.k.consumer_release(state)

    def consumer_release(self, state):
        """Once the PV GEMM is complete: V^T's buffer (unsplit: the stage) is free."""
        self._v_or_k().consumer_release(state)

    def _v_or_k(self):
        return self.k if self.v is None else self.v
