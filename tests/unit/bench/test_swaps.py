"""bench.swaps alternates the weights swap after swap, measures each state once, and compares like with like:
the base with the base, the trained weights with themselves, the no-swap control with itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import bench.swaps as swaps


def test_the_series_alternates_and_each_ratio_compares_the_same_weights(monkeypatch):
    active = {"version": "base"}
    activated: list[str] = []
    measured: list[str] = []

    def activate(policy, version):
        activated.append(version)
        active["version"] = version

    def tok_s(url, prompts, max_tokens, key):  # a service that slows down by 10 tok/s after every swap
        measured.append(active["version"])
        return (400.0 if active["version"] == "base" else 300.0) - 10 * (len(activated) - 1 if activated else 0)

    monkeypatch.setattr(swaps, "activate", activate)
    monkeypatch.setattr(swaps, "tok_s", tok_s)
    ratios = swaps.series(None, "url", ["p"], SimpleNamespace(swaps=4, max_tokens=8, vllm_key="k"), "base", "trained")
    assert activated == ["base", "trained", "base", "trained", "base"]
    assert measured == ["base"] * 5 + ["base", "trained", "base", "trained", "base"]  # control, then the series
    assert ratios["tok_s/control_last_over_first"] == 1.0
    assert ratios["tok_s/base_last_over_first_across_swaps"] == pytest.approx(360 / 400)  # after swaps 0 and 4
    assert ratios["tok_s/trained_last_over_first_across_swaps"] == pytest.approx(270 / 290)  # swaps 1 and 3
    assert ratios["tok_s/trained_over_base_median_across_swaps"] == pytest.approx(280 / 380)
