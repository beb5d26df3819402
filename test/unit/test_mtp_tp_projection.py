"""benchmark/mtp_tp_projection.py's arithmetic: the collective fit recovers known latency and
bandwidth terms, and a projected batch takes the k with the most tokens per second."""

from __future__ import annotations

import pytest

from benchmark.mtp_tp_projection import collective_fit, project_batch
from sgl_inkling.speculative.adaptive import PUBLIC_MTP8_CURVE, conditional_rates, expected_tokens


def test_collective_fit_recovers_alpha_and_beta():
    alpha, beta, tp2_bytes = 0.02, 1e-7, 24576.0
    c2 = {b: 4 * alpha + b * tp2_bytes * beta for b in (1, 64)}  # per layer at TP 2
    tp1 = {1: 0.4, 64: 5.0}
    runs = lambda f: [{"batch_size": b, "cuda_graph_layers_ms_per_layer": f(b)} for b in (1, 64)]  # noqa: E731
    bench_tp = {
        "results": {"tp1": {"runs": runs(lambda b: tp1[b])}, "tp2": {"runs": runs(lambda b: tp1[b] / 2 + c2[b])}},
        "projection_66_layers": [{"tp": 2, "comm_bytes_per_token_per_layer_per_rank": tp2_bytes}],
    }
    fit = collective_fit(bench_tp)
    assert fit["alpha_ms"] == pytest.approx(alpha + tp2_bytes * beta / 4)  # the batch-1 bytes ride on alpha
    assert fit["beta_ms_per_byte"] == pytest.approx(beta)


def test_projected_batch_takes_the_fastest_k():
    runs = [{"k": k, "extrapolated_66_layers": {"step_ms": 30.0 + 6.0 * k}} for k in range(1, 9)]
    m = {"batch_size": 1, "num_steps": 8, "runs": [*runs, {"k": "adaptive"}]}
    fit = {"beta_ms_per_byte": 0.0}
    r = project_batch(m, plain66_ms=28.0, scale=0.5, fit=fit, alpha=0.01, bytes8=0.0)
    rates = conditional_rates(PUBLIC_MTP8_CURVE)
    speeds = {k: expected_tokens(rates, k) * 1e3 / (0.5 * (30 + 6 * k) + (66 + 8) * 4 * 0.01) for k in range(1, 9)}
    want = max(speeds, key=speeds.get)
    assert r["best_k"] == want and r["tok_per_s_per_user_with_mtp"] == pytest.approx(speeds[want])
    assert r["tok_per_s_per_user_without_mtp"] == pytest.approx(1e3 / (14.0 + 66 * 4 * 0.01))


def test_projected_batch_with_tails_counts_only_the_drafting_depths_every_step():
    """With tails the k drafting depths move their tokens every step; the 8 - k lagging ones move the
    kept tokens later, paying their latency once per catch-up (about E_k / (C + 1 - E_k) a step)."""
    alpha, beta, bytes8, b, cap = 0.01, 1e-6, 100.0, 4, 17
    runs = [{"k": k, "extrapolated_66_layers": {"step_ms": 30.0 + 6.0 * k}} for k in range(1, 9)]
    m = {"batch_size": b, "num_steps": 8, "runs": runs, "step_costs": {"tail_capacity": cap}}
    r = project_batch(m, plain66_ms=28.0, scale=0.5, fit={"beta_ms_per_byte": beta}, alpha=alpha, bytes8=bytes8)
    rates = conditional_rates(PUBLIC_MTP8_CURVE)
    for row in r["by_k"]:
        k = row["k"]
        e = expected_tokens(rates, k)
        verify = 66 * (4 * alpha + b * (k + 1) * bytes8 * beta)
        drafting = k * (4 * alpha + b * (k + 2) * bytes8 * beta)
        catch_ups = e / (cap + 1 - e)
        lagging = (8 - k) * (catch_ups * 4 * alpha + b * e * bytes8 * beta)
        assert row["collective_ms"] == pytest.approx(verify + drafting + lagging), k
        assert row["tok_per_s_per_user"] == pytest.approx(e * 1e3 / (0.5 * (30 + 6 * k) + verify + drafting + lagging))
