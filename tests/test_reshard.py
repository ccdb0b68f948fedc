"""reshard_timing and gathered_peak on timelines of the shape a real run records (ZeRO-3 with threshold 0 on the MIDDLE
stack: layer k gathered at grad_done(k+1), freed by grad_done(k)): the clean one passes, a frozen layer kept gathered
after its dgrad and every layer gathered at once fail; a wrapper that shards but gives no timeline is "not observed"
(a failure), one that shards nothing passes saying so."""
from __future__ import annotations

from te_verify.checks.reshard import LayerInfo, gathered_peak, reshard_timing

B = 4224  # a 32x32 layer with bias, fp32
# MIDDLE: layer 1 frozen, the input needs a gradient.
LAYERS = [LayerInfo(B, True, True), LayerInfo(B, False, True), LayerInfo(B, True, True), LayerInfo(B, True, True)]
CLEAN = [("backward_start", 4, [0, 0, 0, 0]), ("grad_done", 4, [0, 0, 0, B]), ("grad_done", 3, [0, 0, B, 0]),
         ("grad_done", 2, [0, B, 0, 0]), ("grad_done", 1, [B, 0, 0, 0]), ("grad_done", 0, [0, 0, 0, 0]),
         ("backward_end", -1, [0, 0, 0, 0])]
# Frozen layer 1 released only at the end of backward (its post-backward release deferred).
LATE = [(e, b, [g[0], B if b in (2, 1, 0) else g[1], *g[2:]]) for e, b, g in CLEAN[:-1]] + [CLEAN[-1]]
# Every layer gathered at the first unshard of backward (a prefetch budget larger than the model).
ALL_AT_ONCE = [CLEAN[0], ("grad_done", 4, [B] * 4), ("grad_done", 3, [B, B, B, 0]), ("grad_done", 2, [B, B, 0, 0]),
               ("grad_done", 1, [B, 0, 0, 0]), *CLEAN[5:]]


def test_clean_timeline_passes_both_checks_saying_what_it_compared():
    timing = reshard_timing("c", "deepspeed_zero3", CLEAN, LAYERS, shards=True)
    assert timing.ok and timing.figures["reshard_frozen_layers_checked"] == 1, timing.figures
    peak = gathered_peak("c", "deepspeed_zero3", CLEAN, LAYERS, True, shards=True)
    assert peak.ok and peak.figures["peak_gathered_bytes_actual"] == B, peak.figures
    assert peak.figures["peak_gathered_bytes_required"] == 2 * B


def test_frozen_layer_kept_gathered_after_its_dgrad_fails_naming_layer_and_release():
    timing = reshard_timing("c", "deepspeed_zero3", LATE, LAYERS, shards=True)
    assert not timing.ok
    assert "frozen layer 1: still holds 4224 B of gathered parameters after its input gradient was done " \
           "(grad_done(1)); resharded only at backward_end(-1)" in timing.message, timing.message


def test_every_layer_gathered_at_once_fails_gathered_peak_only():
    assert reshard_timing("c", "megatron_fsdp", ALL_AT_ONCE, LAYERS, shards=True).ok
    peak = gathered_peak("c", "megatron_fsdp", ALL_AT_ONCE, LAYERS, True, shards=True)
    assert not peak.ok
    assert "16896 B of gathered parameters alive at grad_done(4)" in peak.message and "8448 B" in peak.message


def test_sharding_wrapper_without_a_timeline_is_not_observed():
    for verdict in (reshard_timing("c", "w", [], LAYERS, shards=True),
                    gathered_peak("c", "w", [], LAYERS, True, shards=True)):
        assert not verdict.ok and f"{verdict.check} not observed" in verdict.message, verdict.message
        assert "gives no gathered_bytes probe" in verdict.message


def test_unsharded_wrapper_passes_saying_nothing_is_sharded():
    timing = reshard_timing("c", "ddp", [], LAYERS, shards=False)
    peak = gathered_peak("c", "ddp", [], LAYERS, False, shards=False)
    assert timing.ok and timing.figures == {"reshard_compared": "nothing sharded: no gathers to time"}
    assert peak.ok and peak.figures == {"gathered_peak_compared": "nothing sharded: no gathers"}
