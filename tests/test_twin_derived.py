"""A twin prior derived from what a deployment is (simulator/derive.py, executor/derived.py, `tuneloop sim derive`).

The roofline must count a model as its publishers do, land within about a factor of two of the library's dense GPU
profiles (which are the bench's truths), and reach the twin of a real target that names its card: a goal on it plans
with the twin from its first run, its cards saying where the prior came from.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core import profiles
from core.cards import card
from core.errors import FieldError
from executor.derived import derive_target, gguf_spec, model_of, topology_of
from executor.runner import Executor
from executor.targets import parse_targets
from simulator.derive import GEMM_EFF, MEM_EFF, RoleShape, Topology, derive, derive_for_profile, error_table
from simulator.model_spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
DENSE_GPU = [n for n in profiles.names() if (p := profiles.load(n)).deployment is not None
             and p.deployment.card in ("H100", "H200", "H800", "A100", "L40S", "L4")
             and "num_experts" not in p.deployment.model and "n_routed_experts" not in p.deployment.model]


def spec(name: str) -> ModelSpec:
    d = profiles.load(name).deployment
    assert d is not None
    return ModelSpec.from_hf(d.model, weight_dtype=d.weight_dtype, kv_dtype=d.kv_dtype)


@pytest.mark.parametrize("profile, total, active", [
    ("llama70b-h100-p2d2", 70.55e9, None),  # Meta-Llama-3-70B: 70.55 B
    ("llama31-8b-l40s-p1d1", 8.03e9, None),  # Llama-3.1-8B: 8.03 B
    ("qwen25-7b-a100-mixed", 7.62e9, None),  # Qwen2.5-7B: 7.61 B
    ("qwen3-235b-h800-p8d8", 235e9, 22e9),  # Qwen3-235B-A22B
    ("qwen3-30b-a3b-910b-p4d4", 30.5e9, 3.3e9),  # Qwen3-30B-A3B
    ("deepseek-v3-h200-p8d8", 671e9, 37e9),  # DeepSeek-V3: 671 B, 37 B active (the MTP module apart)
])
def test_the_model_is_counted_as_its_publishers_count_it(profile: str, total: float, active: float | None) -> None:
    m = spec(profile)
    assert m.total_params() == pytest.approx(total, rel=0.02)
    if active is not None:  # publishers count the input embedding among the activated parameters; a step reads it,
        # it does not multiply it (active_params)
        assert m.active_params() + m.vocab * m.hidden == pytest.approx(active, rel=0.06)


def test_kv_bytes_per_token_are_the_profiles_own_hand_off() -> None:
    """The KV a token leaves (what a P/D hand-off moves) is the library's transfer figure where it states one."""
    for name in ("llama70b-h100-p2d2", "llama31-70b-h100-p8d4-tcp", "qwen25-32b-h100-p2d2", "qwen3-30b-a3b-910b-p4d4",
                 "llama31-8b-l40s-p1d1"):
        assert spec(name).kv_bytes_per_token() == profiles.load(name).transfer.kv_bytes_per_token, name
    assert spec("deepseek-v3-h200-p8d8").kv_bytes_per_token() == 61 * (512 + 64) * 2  # MLA: the latent, not K and V


def test_a_decode_step_is_its_weight_read_and_a_token_its_flops() -> None:
    """The formulas as documented: Llama-3-70B FP8 on two H100 per decode instance."""
    m, c = spec("llama70b-h100-p2d2"), card("H100")
    d = derive(m, c, Topology(prefill=RoleShape(cards_per_instance=2), decode=RoleShape(cards_per_instance=2)))
    dc, pc = d.profile.decode_cost, d.profile.prefill_cost
    bw = c.mem_bw_gb_s * 1e9 * MEM_EFF
    launches = 80 * 5e-6 + 2 * 80 * 10e-6  # graph launches + two all-reduces per layer
    assert dc.a == pytest.approx(m.total_params() / 2 / bw + launches, rel=1e-9)
    per_token = 2 * m.active_params() / (2 * 1979e12 * GEMM_EFF)
    assert per_token < dc.b < per_token * 1.1  # plus the all-reduce's bytes
    assert dc.c == pytest.approx(2 * 80 * 8 * 128 * 2 / 2 / bw, rel=1e-9)  # BF16 KV, 8 heads split over TP2
    assert pc.c == pytest.approx(4 * 80 * 64 * 128 / (2 * 989e12 * 0.5), rel=1e-9)
    assert d.profile.transfer.kv_bytes_per_token == 327680
    assert d.profile.decode_cost.weights_memory_fraction == pytest.approx(m.total_params() / 2 / (80 * 2 ** 30),
                                                                          rel=1e-3)
    rows = {r.name: r for r in d.rows}
    assert rows["decode.a"].factor and rows["decode.a"].factor > 1 and "GB weights per device" in rows["decode.a"].how


def _floor(name: str, coef: str) -> float:
    """The fastest a coefficient can physically be on its card: the weight read at 100 % of peak bandwidth (prefill
    a) or the attention FLOPs at 100 % of peak (prefill c). A truth below it no roofline can come within x2 of
    without assuming a device beyond its datasheet."""
    p, m = profiles.load(name), spec(name)
    c = card(p.deployment.card)  # type: ignore[union-attr]
    r = p.decode.cards_per_instance if p.mixed else p.prefill.cards_per_instance
    if coef == "prefill.a":
        return m.total_params() * m.weight_bytes / r / (c.mem_bw_gb_s * 1e9)
    if coef == "prefill.c":
        return m.prefill_pair_flops() / (r * c.peak("bf16"))
    return 0.0


def test_the_derived_prior_is_within_x2_of_every_dense_gpu_profile() -> None:
    """Every step cost (a, b, c of prefill and decode) and the KV capacity of the library's dense GPU profiles, from
    their model, card and topology alone - except where the library's own figure is faster than its card allows."""
    assert len(DENSE_GPU) >= 6, DENSE_GPU
    misses = []
    for name in DENSE_GPU:
        truth = profiles.load(name)
        for coef, derived, value, ratio in error_table(derive_for_profile(truth).profile, truth):
            if "draft" in coef or 0.5 <= ratio <= 2.0:
                continue
            if value < _floor(name, coef):  # the library's figure beats the card's datasheet
                continue
            misses.append((name, coef, round(ratio, 2)))
    # the one real miss: the library gives the same model, card and TP2 prefill b 1.18e-4 (llama70b-h100-p2d2) and
    # 1.6e-4 here; the roofline's 7.6e-5 is within x2 of the first, x0.48 of the second
    assert misses == [("llama31-70b-h100-p8d4-tcp", "prefill.b", 0.48)]


def test_a_real_targets_prior_is_derived_from_its_model_card_and_hosts(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 12,
        "intermediate_size": 2048, "vocab_size": 300, "torch_dtype": "float32"}))
    targets = parse_targets({"targets": [
        {"name": "gpu-pd", "kind": "local", "engine": "vllm", "model": str(model), "card": "H100",
         "run_root": str(tmp_path / "r"),
         "hosts": [{"host": "127.0.0.1", "roles": ["prefill", "load"], "cards": 2, "port": 9001},
                   {"host": "127.0.0.2", "roles": ["prefill"], "cards": 2, "port": 9001},
                   {"host": "127.0.0.3", "roles": ["decode"], "cards": 4, "port": 9001},
                   {"host": "127.0.0.4", "roles": ["router"], "cards": 0, "port": 9000}]},
        {"name": "nocard", "kind": "local", "engine": "vllm", "model": str(model), "run_root": str(tmp_path / "r"),
         "hosts": [{"host": "127.0.0.1", "roles": ["mixed", "load"], "cards": 1, "port": 9001}]}]})
    t = targets["gpu-pd"]
    assert model_of(t).layers == 8 and model_of(t).weight_dtype == "fp32"
    topo = topology_of(t)
    assert (topo.prefill.instances, topo.prefill.cards_per_instance, topo.decode.instances,
            topo.decode.cards_per_instance, topo.mixed) == (2, 2, 1, 4, False)
    d = derive_target(t)
    assert d.profile.prefill.instances == 2 and d.profile.decode.cards_per_instance == 4
    assert "derived by roofline" in d.origin() and "H100" in d.origin()
    with pytest.raises(FieldError) as e:
        derive_target(targets["nocard"])
    assert e.value.field == "card"


def test_a_card_kind_the_table_does_not_know_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="card"):
        parse_targets({"targets": [{"name": "t", "kind": "local", "engine": "vllm", "model": "m", "card": "H1000",
                                    "hosts": [{"host": "127.0.0.1", "roles": ["mixed", "load"]}]}]})


def test_a_gguf_model_is_read_from_its_header(tmp_path: Path) -> None:
    from executor.engines.llamacpp_model import ModelRecipe, write_model

    recipe = ModelRecipe(n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128)
    path = write_model(recipe, tmp_path / "m.gguf")
    m = gguf_spec(path)
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.intermediate) == (64, 2, 4, 2, 128)
    assert m.total_params() == recipe.params()


def test_the_twin_of_a_real_target_starts_from_its_derived_prior(tmp_path: Path) -> None:
    """The executor hands the loop a fitter whose fit on no run is the derived prior (it predicts the first run);
    one whose model cannot be read answers why (the rules lead, the cards say so); one that names no card has none."""
    from state.store import Store

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 768,
        "vocab_size": 300, "torch_dtype": "float32"}))
    base = {"kind": "local", "engine": "vllm", "model": str(model), "run_root": str(tmp_path / "r"),
            "env": {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
            "hosts": [{"host": "127.0.0.1", "roles": ["mixed", "load"], "cards": 1, "port": 9001}]}
    targets = parse_targets({"targets": [base | {"name": "cpu", "card": "cpu"}, base | {"name": "bare"},
                                         base | {"name": "nomodel", "card": "cpu", "model": str(tmp_path / "none")}]})
    import os
    os.environ["TUNELOOP_RUNS_ROOT"] = str(tmp_path / "runs")
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        ex = Executor(store, targets)
        fit = ex.twin_fitter("cpu", None)(())  # type: ignore[misc]
        assert not isinstance(fit, str), fit
        assert fit.profile.mixed and fit.profile.decode_cost.a > 0
        assert fit.origin.startswith("prior derived by roofline") and "on cpu with vllm" in fit.origin
        prior = Path(fit.prior)
        assert prior.parent == Path(ex.root) / "_priors" and prior.is_file()
        assert yaml.safe_load(prior.read_text())["derived"]["card"] == "cpu"
        kv = fit.profile.decode_cost.kv_tokens_at_full_memory  # 1 GiB of KV over 4 layers x 2 x 256 x 4 B a token
        assert kv == int(2 ** 30 / (4 * 2 * 256 * 4) / 0.9)
        assert ex.twin_fitter("bare", None) is None  # no card named: no twin, the rules lead as before
        why = ex.twin_fitter("nomodel", None)(())  # type: ignore[misc]
        assert isinstance(why, str) and "model_config_json" in why
    finally:
        store.close()
        os.environ.pop("TUNELOOP_RUNS_ROOT", None)


def test_sim_derive_prints_the_prior_and_its_error_against_a_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    r = subprocess.run([sys.executable, "-m", "tuneloop_cli", "sim", "derive", "--profile", "llama70b-h100-p2d2",
                        "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "derived by roofline from meta-llama/Meta-Llama-3-70B-Instruct" in r.stdout
    assert "decode.a" in r.stdout and "against llama70b-h100-p2d2's own coefficients" in r.stdout
    derived = profiles.load(str(out))  # a profile a target can name as its calibrated_profile
    assert derived.deployment is None and derived.derived and derived.derived["card"] == "H100"
    bad = subprocess.run([sys.executable, "-m", "tuneloop_cli", "sim", "derive", "--profile", "vllm-cpu-tiny"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "deployment" in bad.stderr
    assert not math.isnan(derived.decode_cost.a)


def test_a_sim_targets_twin_may_start_from_a_prior_apart_from_what_it_simulates(tmp_path: Path) -> None:
    """bench --prior derived: the simulator runs the case's profile while the twin starts from the derived prior."""
    from executor.targets import Target
    from executor.twin import prior_of

    t = Target(name="sim", kind="sim", engine="sim", profile="llama70b-h100-p2d2", twin_prior=str(tmp_path / "d.yaml"))
    assert prior_of(t, "llama70b-h100-p2d2") == str(tmp_path / "d.yaml")
    assert t.simulated_profile == "llama70b-h100-p2d2"
    with pytest.raises(ValueError, match="twin_prior"):
        parse_targets({"targets": [{"name": "t", "kind": "local", "engine": "vllm", "model": "m", "twin_prior": "x",
                                    "hosts": [{"host": "127.0.0.1", "roles": ["mixed", "load"]}]}]})
