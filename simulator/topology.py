"""A role's step costs at another layout of its ranks: TP width, DP replicas, EP size (docs/simulator.md).

A profile's coefficients are measured at its own layout per role (`Profile.reference`: TP, DP, EP); a role whose
`tp` is 0 has a fixed layout and is never re-laid. For an instance at layout L = (TP, DP, EP) against the
reference L0, with s = TP0 / TP (the share of a step's compute each rank now does):

    comm_a(L) = tp_a·log2 TP + ep_a·log2 EP             (per step: the collectives' latency)
    comm_b(L) = tp_b·2(TP-1)/TP + ep_b·(EP-1)/EP         (per token: the all-reduce's and all-to-all's bytes)
    s_a = (1 - e)·s + e·shard0/shard     (e = expert_share: routed experts' share of a and of the weights;
                                          a shard = EP under expert parallelism, else TP)
    a' = (a - comm_a(L0))·s_a + comm_a(L)      b' = (b - comm_b(L0))·s + comm_b(L)      c' = c·s
    a_draft' = a_draft·s   b_draft' = b_draft·s   weights_memory_fraction' = weights_memory_fraction·s_a

and EP' = EP (the MoE imbalance IF of simulator.decode: the most loaded of EP ranks gates the step; EP 1: none).
Decode DP replicas are independent schedulers: an instance at DP runs DP / DP0 decode engines, each with
`max_num_seqs` sequence slots and an equal share of the instance's KV pool; prefill DP ranks step in lockstep
(simulator.prefill). At L = L0 nothing is touched (the profile's own costs, bit for bit).
"""
from __future__ import annotations

import math
from typing import Any

from core.errors import FieldError
from core.profiles import DecodeCost, PrefillCost, Profile


def comm(cost: PrefillCost | DecodeCost, layout: tuple[int, int, int]) -> tuple[float, float]:
    """(seconds per step, seconds per token) of the layout's TP all-reduces and EP all-to-all."""
    tp, _, ep = layout
    return (cost.tp_a * math.log2(tp) + cost.ep_a * math.log2(ep),
            cost.tp_b * 2 * (tp - 1) / tp + cost.ep_b * (ep - 1) / ep)


def scales(cost: Any, ref: tuple[int, int, int], layout: tuple[int, int, int]) -> tuple[float, float]:
    """(s, s_a): the share of per-token compute each rank does against the reference (TP0 / TP), and of the fixed
    cost a and the weights in memory: (1 - e)·TP0/TP + e·shard0/shard, e = expert_share, a shard = EP under
    expert parallelism, else TP."""
    if layout == ref:
        return 1.0, 1.0
    s = ref[0] / layout[0]
    shard0, shard = (ref[2] if ref[2] > 1 else ref[0]), (layout[2] if layout[2] > 1 else layout[0])
    e = cost.expert_share
    return s, (1 - e) * s + e * shard0 / shard


def relaid(cost: Any, ref: tuple[int, int, int], layout: tuple[int, int, int], role: str) -> Any:
    """The role's cost model at `layout` (the same object at the reference layout)."""
    if layout == ref:
        return cost
    s, sa = scales(cost, ref, layout)
    a0, b0 = comm(cost, ref)
    a1, b1 = comm(cost, layout)
    if cost.a < a0 or cost.b < b0:
        raise FieldError(f"{role}_cost.tp_a", "the profile's communication terms exceed its step costs a / b at its "
                         "own layout")
    upd: dict[str, Any] = {"a": (cost.a - a0) * sa + a1, "b": (cost.b - b0) * s + b1, "c": cost.c * s}
    if isinstance(cost, DecodeCost):
        wmf = cost.weights_memory_fraction * sa
        if wmf >= 1:
            raise FieldError("tensor_parallel_size", f"TP {layout[0]}, EP {layout[2]}: the {role} weights do not "
                             f"fit a card ({wmf:.0%} of its memory)")
        upd |= {"a_draft": cost.a_draft * s, "b_draft": cost.b_draft * s, "ep": layout[2],
                "weights_memory_fraction": wmf}
    return cost.model_copy(update=upd)


def roles(profile: Profile, knobs: dict[str, Any]) -> dict[str, tuple[tuple[int, int, int], Any, int]]:
    """Per role: (its layout, its cost model there, engines per instance: decode DP replicas over the profile's)."""
    out = {}
    for role, cost in (("prefill", profile.prefill_cost), ("decode", profile.decode_cost)):
        ref, lay = profile.reference(role), profile.layout(role, knobs)
        engines = 1
        if role == "decode" and lay[1] != ref[1]:
            if lay[1] % ref[1]:
                raise FieldError("data_parallel_size", f"decode DP {lay[1]} is not a multiple of the profile's "
                                 f"{ref[1]} lockstep ranks per engine")
            engines = lay[1] // ref[1]
        out[role] = (lay, relaid(cost, ref, lay, role), engines)
    return out
