"""The simulator's topology model (simulator/topology.py, docs/simulator.md): TP width, DP replicas and EP size per
role over a fixed card count; the profiles whose layout is fixed are untouched; the twin's calibration fits the
communication terms from runs at two TP widths and predicts a third out of sample."""
from __future__ import annotations

import math

import pytest

from core import profiles
from core.errors import FieldError
from simulator import engine, topology
from simulator.calibrate import calibrate
from simulator.cluster import Cluster
from simulator.perturb import perturb

TP_PROFILE = "llama31-8b-l40s-p4d4-tp"
MOE_PROFILE = "qwen3-30b-a3b-h100-p4d4-tp"


@pytest.mark.parametrize("name", profiles.names())
def test_a_fixed_or_unchanged_layout_keeps_the_profiles_own_costs(name):
    prof = profiles.load(name)
    knobs = prof.knobs({"tensor_parallel_size": 2} if not prof.decode.tp else {})
    roles = topology.roles(prof, knobs)  # a fixed role ignores the knob; a re-laid one at its own layout
    assert roles["prefill"][1] is prof.prefill_cost and roles["decode"][1] is prof.decode_cost
    assert roles["decode"][2] == 1 and roles["prefill"][0] == prof.reference("prefill")


def test_tp_width_rescales_compute_and_communication_by_the_formula():
    prof = profiles.load(TP_PROFILE)
    dc = prof.decode_cost
    lay, cost, engines = topology.roles(prof, prof.knobs({"tensor_parallel_size": 2}))["decode"]
    assert lay == (2, 2, 1) and engines == 2
    comm4 = dc.tp_a * 2, dc.tp_b * 2 * 3 / 4
    assert cost.a == pytest.approx((dc.a - comm4[0]) * 2 + dc.tp_a * 1)
    assert cost.b == pytest.approx((dc.b - comm4[1]) * 2 + dc.tp_b * 1)
    assert cost.c == pytest.approx(dc.c * 2)
    assert cost.weights_memory_fraction == pytest.approx(dc.weights_memory_fraction * 2)
    # data_parallel_size says the same where tensor_parallel_size is null
    assert topology.roles(prof, prof.knobs({"data_parallel_size": 2}))["decode"][0] == (2, 2, 1)


def test_dp_replicas_are_engines_of_their_own_with_a_share_of_the_kv_pool():
    prof = profiles.load(TP_PROFILE)
    one = Cluster(prof, {})
    four = Cluster(prof, {"tensor_parallel_size": 1, "max_num_seqs": 32})
    assert [d.name for d in one.decode] == ["d0"]
    assert [d.name for d in four.decode] == ["d0.dp0", "d0.dp1", "d0.dp2", "d0.dp3"]
    assert all(d.max_num_seqs == 32 for d in four.decode)
    assert len(four.prefill[0].queues) == 4  # prefill DP ranks in lockstep
    assert four.cards == one.cards == 8
    # TP1 holds 4x the weights per card: each replica's pool is a quarter of a smaller instance pool
    assert four.decode[0].kv_capacity * 4 < one.decode[0].kv_capacity


def test_expert_parallel_shards_experts_and_pays_all_to_all_and_the_slowest_rank():
    prof = profiles.load(MOE_PROFILE)
    off = topology.roles(prof, prof.knobs({"tensor_parallel_size": 1}))["decode"]
    on = topology.roles(prof, prof.knobs({"tensor_parallel_size": 1, "enable_expert_parallel": True}))["decode"]
    assert off[0] == (1, 4, 1) and on[0] == (1, 4, 4)
    assert on[1].ep == 4 and off[1].ep == 1
    assert on[1].weights_memory_fraction < off[1].weights_memory_fraction  # experts sharded over 4 ranks
    dc = prof.decode_cost
    e = dc.expert_share
    assert on[1].a == pytest.approx((dc.a - dc.tp_a * 2) * ((1 - e) * 4 + e) + dc.ep_a * 2)
    run = engine.simulate(prof, "chat1k-out512", {"tensor_parallel_size": 1, "enable_expert_parallel": True,
                                                  "concurrency": 64}, n=64, seed=0)
    assert set(run.expert_load["decode"]) == {f"d0.dp{r}" for r in range(4)}  # per replica, 4 EP ranks each
    assert all(len(v["per_rank_tokens"]) == 4 for v in run.expert_load["decode"].values())


@pytest.mark.parametrize("knobs, field", [({"tensor_parallel_size": 3}, "tensor_parallel_size"),
                                          ({"data_parallel_size": 3}, "data_parallel_size")])
def test_a_layout_that_does_not_divide_the_ranks_is_refused_naming_the_knob(knobs, field):
    prof = profiles.load(TP_PROFILE)
    with pytest.raises(FieldError) as e:
        Cluster(prof, knobs)
    assert e.value.field == field and "does not divide" in str(e.value)


def test_a_profile_whose_own_knobs_do_not_give_its_layout_is_refused():
    data = profiles.load(TP_PROFILE).model_dump()
    data["defaults"] = data["defaults"] | {"data_parallel_size": 2}
    with pytest.raises(Exception) as e:
        profiles.Profile.model_validate(data)
    assert "decode.tp" in str(e.value) or "prefill.tp" in str(e.value)


def _tok_s(prof, knobs, seed=0):
    run = engine.simulate(prof, "chat512-out256", prof.knobs(knobs), n=240, seed=seed, observe=False)
    out = sum(r.n_out for r in run.records)
    return out / (max(r.chunk_times[-1] for r in run.records) - min(r.t_send for r in run.records))


def test_the_twin_fits_tp_communication_from_two_widths_and_predicts_a_third(tmp_path):
    base = profiles.load(TP_PROFILE)
    truth = perturb(base, 3)
    dirs = []
    for i, tp in enumerate((None, 2)):
        knobs = {"tensor_parallel_size": tp, "max_num_seqs": 128, "concurrency": 128, "request_rate": math.inf}
        run = engine.simulate(truth, "chat512-out256", truth.knobs(knobs), n=200, seed=i)
        engine.write_run_dir(run, tmp_path / f"r{i}")
        dirs.append(tmp_path / f"r{i}")
    cal = calibrate(dirs, base)
    assert "tp_a" in cal.decode.values and "tp_b" in cal.decode.values  # fitted, not held
    knobs = {"tensor_parallel_size": 1, "max_num_seqs": 128, "concurrency": 128, "request_rate": math.inf}
    got, want, prior = _tok_s(cal.profile, knobs), _tok_s(truth, knobs), _tok_s(base, knobs)
    assert abs(got / want - 1) < 0.10, (got, want)
    assert abs(got / want - 1) < abs(prior / want - 1)  # the fit, not the prior, carries the prediction
