"""GPTQ rounding (runners/lite/gptq.py) and the calibration forward it rounds by (runners/lite/calibration.py)."""

from __future__ import annotations

import numpy as np
from tiny_model import random_weights, tiny_config

from typewriter.runners.lite import gptq
from typewriter.runners.lite.calibration import Calibration, text
from typewriter.runners.lite.layers import RotationFolder
from typewriter.runners.lite.programs import make_programs
from typewriter.runners.lite.runner import LiteRunner
from typewriter.runners.rotation import quantize_int8

RNG = np.random.default_rng(0)


def correlated_rows(mix: np.ndarray, count: int) -> np.ndarray:
    """Rows that share a few directions (as a layer's activations do), plus a little noise of their own."""
    latent = RNG.standard_normal((count, mix.shape[0])).astype(np.float32)
    return latent @ mix + 0.1 * RNG.standard_normal((count, mix.shape[1])).astype(np.float32)


def output_error(x: np.ndarray, w: np.ndarray, rounded: tuple[np.ndarray, np.ndarray]) -> float:
    q, scale = rounded
    return float(np.mean((x @ (q * scale) - x @ w) ** 2))


def test_on_correlated_inputs_gptq_moves_the_outputs_far_less_than_rounding_to_nearest_on_rows_it_never_saw():
    mix = RNG.standard_normal((8, 128)).astype(np.float32)
    w = RNG.standard_normal((128, 64)).astype(np.float32)
    seen = correlated_rows(mix, 400)
    q, scale = gptq.quantize(w, seen.T @ seen / len(seen))
    nearest = quantize_int8(w)
    assert q.dtype == np.int8 and q.shape == w.shape and np.abs(q.astype(int)).max() <= 127
    np.testing.assert_array_equal(scale, nearest[1])  # the format is unchanged: only which step each weight takes
    unseen = correlated_rows(mix, 2000)
    assert output_error(unseen, w, (q, scale)) < 0.5 * output_error(unseen, w, nearest)


def test_with_uncorrelated_inputs_there_is_nothing_to_make_up_for_and_it_rounds_to_nearest():
    w = RNG.standard_normal((96, 40)).astype(np.float32)  # 96: groups of 32, the widest that divide it
    h = np.diag(RNG.uniform(0.1, 4.0, 96)).astype(np.float32)
    np.testing.assert_array_equal(gptq.quantize(w, h)[0], quantize_int8(w)[0])


def test_an_input_that_is_always_zero_gets_zero_weights_and_the_rest_stay_finite():
    w = RNG.standard_normal((64, 16)).astype(np.float32)
    x = RNG.standard_normal((50, 64)).astype(np.float32)
    x[:, 5] = 0.0
    q, scale = gptq.quantize(w, x.T @ x / len(x))
    assert not q[5].any()
    assert np.isfinite(scale).all()


def test_the_calibration_forward_computes_what_the_programs_compute():
    """The moments are only as good as the forward that measures them: run the text through Calibration with the
    matrices rounded to nearest, and its logits must match the programs made the same way (8-bit rows apart)."""
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    folder = RotationFolder(cfg, weights)
    ids = [int(i) for i in RNG.integers(0, cfg.vocab_size, 40)]
    calibration = Calibration(cfg, folder.embeddings(), ids)
    for i in range(cfg.n_layers):
        layer = folder.layer(i)
        layer["qkv"] = quantize_int8(layer["qkv"])
        calibration.run_layer(layer, folder.down_block, lambda w, moment: quantize_int8(w))
    x = calibration.x / np.sqrt(np.mean(calibration.x ** 2, axis=-1, keepdims=True) + cfg.norm_eps)
    q, scale = quantize_int8(np.concatenate([columns for _, _, columns in folder.output()], axis=1))
    want = LiteRunner(cfg, weights, 1, 64, 64).extend(0, 0, ids, all_logits=True)
    np.testing.assert_allclose(x @ (q * scale), want, atol=0.05 * np.abs(want).max())


def test_programs_made_with_a_calibration_round_differently_and_the_text_is_shipped(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    ids = [int(i) for i in RNG.integers(0, cfg.vocab_size, 100)]
    (tmp_path / "nearest").mkdir()
    (tmp_path / "calibrated").mkdir()
    nearest = make_programs(cfg, weights, tmp_path / "nearest")
    calibrated = make_programs(cfg, weights, tmp_path / "calibrated", calibration=ids)
    assert nearest.layer(0).read_bytes() != calibrated.layer(0).read_bytes()
    assert nearest.logits.read_bytes() != calibrated.logits.read_bytes()
    np.testing.assert_array_equal(nearest.embeddings(), calibrated.embeddings())
    assert len(text()) > 1000  # package data: an installed wheel holds it


def test_the_c_loop_rounds_as_numpys_but_for_float_ties_and_needs_only_the_diagonal_blocks():
    """gptq.c (two threads over the columns) against the numpy loop, and blocks from `moment` against the whole
    second moment: the same rounding but where a float's order of additions tips a value across a half step."""
    from typewriter.runners.lite.kernel import load as load_kernel

    kernel = load_kernel(None)
    assert kernel is not None
    x = RNG.standard_normal((300, 192)).astype(np.float32) * RNG.uniform(0.1, 3.0, 192).astype(np.float32)
    w = RNG.standard_normal((192, 1000)).astype(np.float32)
    q_numpy, s_numpy = gptq.quantize(w, x.T @ x / len(x))
    q_c, s_c = gptq.quantize(w, gptq.moment(x), kernel=kernel)
    np.testing.assert_array_equal(s_numpy, s_c)
    assert (q_numpy != q_c).mean() < 1e-3 and np.abs(q_numpy.astype(int) - q_c).max() <= 1
    assert (q_numpy != quantize_int8(w)[0]).mean() > 0.05  # and neither is round-to-nearest
    assert gptq.moment(x).shape == (3, 64, 64)
    np.testing.assert_allclose(gptq.moment(x)[1], (x.T @ x / len(x))[64:128, 64:128], rtol=1e-4, atol=1e-4)
