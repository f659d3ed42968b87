"""Opt-in calibration: measured once, cached, and part of the cache key."""

from __future__ import annotations

import pytest

from fxremat import calibrate as calibrate_module
from fxremat.options import Options


def test_calibration_is_measured_once_then_read_from_cache(tmp_path, monkeypatch):
    first = calibrate_module.calibrate("cpu", directory=tmp_path)
    assert first.mem_bandwidth > 1e8 and first.peak_flops(None) > 1e8  # plausible for any CPU
    assert list(tmp_path.glob("profile-*.json"))

    def no_measuring(device):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(calibrate_module, "measure", no_measuring)
    assert calibrate_module.calibrate("cpu", directory=tmp_path) == first
    with pytest.raises(AssertionError, match="measured again"):
        calibrate_module.calibrate("cpu", directory=tmp_path, force=True)


def test_calibrated_profile_numbers_enter_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options = Options.create(device="calibrated")
    assert options.device.name.startswith("calibrated:")
    assert repr(options.device.mem_bandwidth) in options.cache_key()
    assert options.profile_for("cpu") is options.device


def test_calibrated_profile_carries_a_fitted_shape_model_through_its_cache(tmp_path):
    first = calibrate_module.calibrate("cpu", directory=tmp_path)
    assert first.gemm is not None and 0 <= first.gemm.depth_half <= calibrate_module.MATMUL_SIZE
    assert calibrate_module.calibrate("cpu", directory=tmp_path) == first


@pytest.mark.parametrize(
    "shallow_share, expected",
    [(1.0, 0.0), (1.2, 0.0), (0.1, 1024.0), (0.5, 1024 * 128 * 0.5 / (1024 * 0.5 - 128))],
)
def test_depth_half_fit(shallow_share, expected):
    # a shallow GEMM (128 deep) at ``shallow_share`` of a deep one's (1024) rate
    assert calibrate_module.fit_depth_half(1e12, shallow_share * 1e12, 1024, 128) == pytest.approx(expected)
