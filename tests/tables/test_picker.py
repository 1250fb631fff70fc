"""The picker: every lookup branch, nearest density in log space, fallbacks that never raise."""

from __future__ import annotations

import math
import warnings

import pytest
from test_tables_toy import DEVICE, KERNEL, SHAPE, SPEC, cfg, entry, put, table, toy_registered  # noqa: F401

from moetune.device import INTERPRETER, DeviceInfo
from moetune.tables import format as tables
from moetune.tables import picker

H = DeviceInfo(name=DEVICE, arch="sm_90", sm_count=132, max_shared_mem=232448, l2_bytes=60 << 20, is_gpu=True)
OTHER = DeviceInfo(name="NVIDIA Other", arch="sm_90", sm_count=114, max_shared_mem=232448, l2_bytes=50 << 20,
                   is_gpu=True)
ADA = DeviceInfo(name="NVIDIA Ada", arch="sm_89", sm_count=142, max_shared_mem=101376, l2_bytes=96 << 20,
                 is_gpu=True)
E = SHAPE["E"]


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """(env dir, packaged dir), both empty; the picker sees only these."""
    env, packaged = tmp_path / "env", tmp_path / "packaged"
    env.mkdir()
    packaged.mkdir()
    monkeypatch.setenv(picker.ENV_VAR, str(env))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: (packaged,))
    picker.clear_cache()
    yield env, packaged
    picker.clear_cache()


def pick(routes, device=H, **kw):
    return picker.pick_config_with_source(KERNEL, SHAPE, routes, device=device, **kw)


def test_no_table_gives_the_spec_heuristic(dirs):
    p = pick(16)
    assert p.source == "heuristic" and p.path is None
    assert dict(p.config) == SPEC.heuristic(SHAPE, 16, "sm_90") == SPEC.default
    # below sm_90 the heuristic is the density rule: 16, 32, then 128 rows
    got = [picker.pick_config(KERNEL, SHAPE, r * E, device=ADA)["BLOCK_SIZE_M"] for r in (2, 24, 96)]
    assert got == [16, 32, 128]


def test_device_table_wins_over_arch_table(dirs):
    _, packaged = dirs
    dev = put(packaged, table([entry(2.0, cfg(16))], device=DEVICE))
    put(packaged, table([entry(2.0, cfg(32))], device=None))
    p = pick(2 * E)
    assert (p.source, p.path, dict(p.config)) == ("device", str(dev), cfg(16))


def test_other_device_of_the_arch_gets_the_arch_table(dirs):
    _, packaged = dirs
    put(packaged, table([entry(2.0, cfg(16))], device=DEVICE))
    arch = put(packaged, table([entry(2.0, cfg(32))], device=None))
    p = pick(2 * E, device=OTHER)
    assert (p.source, p.path, dict(p.config)) == ("arch", str(arch), cfg(32))
    # and another arch gets neither
    assert pick(2 * E, device=ADA).source == "heuristic"


def test_env_dir_overrides_the_packaged_tables(dirs):
    env, packaged = dirs
    put(packaged, table([entry(2.0, cfg(16))], device=DEVICE))
    mine = put(env, table([entry(2.0, cfg(32))], device=None))
    p = pick(2 * E)
    assert (p.source, p.path, dict(p.config)) == ("arch", str(mine), cfg(32))


def test_device_given_by_name_finds_its_arch_from_the_tables(dirs):
    _, packaged = dirs
    dev = put(packaged, table([entry(2.0, cfg(16))], device=DEVICE))
    p = picker.pick_config_with_source(KERNEL, SHAPE, 2 * E, device=DEVICE)
    assert (p.source, p.path) == ("device", str(dev))
    assert picker.pick_config_with_source(KERNEL, SHAPE, 2 * E, device="Unknown GPU").source == "heuristic"
    p = picker.pick_config_with_source(KERNEL, SHAPE, 2 * E, device="Unknown GPU", arch="sm_89")
    assert dict(p.config) == SPEC.heuristic(SHAPE, 2 * E, "sm_89")


def test_current_device_is_used_when_none_is_given(dirs):
    _, packaged = dirs
    put(packaged, table([entry(1.0, cfg(16))], arch="interpreter", device=None))
    p = picker.pick_config_with_source(KERNEL, SHAPE, E)
    assert p.source == "arch" and "interpreter" in p.path
    assert picker.pick_config(KERNEL, SHAPE, E, device=INTERPRETER) == cfg(16)


KEYS = [0.5, 2.0, 8.0]


@pytest.fixture
def three(dirs):
    env, _ = dirs
    put(env, table([entry(0.5, cfg(16)), entry(2.0, cfg(32)), entry(8.0, cfg(64))]))


@pytest.mark.parametrize("routes, key", [
    (4, 0.5), (16, 2.0), (64, 8.0),          # at keys (E = 8: density = routes / 8)
    (8, 0.5), (7, 0.5), (9, 2.0),            # density 1 is the log-midpoint of 0.5 and 2: the lower wins
    (32, 2.0), (31, 2.0), (33, 8.0),         # density 4, the log-midpoint of 2 and 8
    (1, 0.5), (0, 0.5),                      # below the range, and no routes at all: the lowest key
    (65, 8.0), (4096, 8.0),                  # above the range: the highest key
])
def test_nearest_density_in_log_space(three, routes, key):
    p = pick(routes)
    assert (p.source, p.density_key) == ("device", key)
    assert dict(p.config) == {0.5: cfg(16), 2.0: cfg(32), 8.0: cfg(64)}[key]
    assert math.isclose(tables.density_key(p.density_key), key)


def test_an_entry_the_constraints_reject_here_gives_way_to_the_next_nearest(dirs):
    env, _ = dirs
    put(env, table([entry(0.5, cfg(16)), entry(8.0, cfg(128))]))
    # density 2.5: 8 is nearer in log space, but BLOCK_SIZE_M 128 is far over 2.5 rows per expert
    p = pick(20)
    assert (p.density_key, dict(p.config)) == (0.5, cfg(16))
    assert dict(pick(64).config) == cfg(128)


def test_returned_configs_are_copies(three):
    a = picker.pick_config(KERNEL, SHAPE, 16, device=H)
    a["BLOCK_SIZE_M"] = 999
    assert picker.pick_config(KERNEL, SHAPE, 16, device=H) == cfg(32)
    with pytest.raises(TypeError):
        pick(16).config["BLOCK_SIZE_M"] = 1  # the cached answer is read-only


def _corrupt(path, how):
    if how == "truncated":
        path.write_text(path.read_text()[:40])
    elif how == "version":
        path.write_text(path.read_text().replace('"version": 1', '"version": 99'))
    elif how == "nan":
        path.write_text(path.read_text().replace('"time_ms": 1.0', '"time_ms": NaN'))
    elif how == "bad config":
        path.write_text(path.read_text().replace('"BLOCK_SIZE_M": 16', '"BLOCK_SIZE_M": 17'))
    elif how == "unreadable":
        path.unlink()
        path.mkdir()  # exists, but reading it fails


@pytest.mark.parametrize("how", ["truncated", "version", "nan", "bad config", "unreadable"])
def test_a_bad_device_table_warns_once_and_falls_back_to_the_arch_table(dirs, how):
    env, _ = dirs
    dev = put(env, table([entry(2.0, cfg(16))], device=DEVICE))
    arch = put(env, table([entry(2.0, cfg(32))], device=None))
    _corrupt(dev, how)
    with pytest.warns(picker.TableWarning, match=str(dev).replace("\\", "\\\\")) as caught:
        p = pick(16)
        pick(17)
        pick(16)
    assert len([w for w in caught if issubclass(w.category, picker.TableWarning)]) == 1
    assert (p.source, p.path, dict(p.config)) == ("arch", str(arch), cfg(32))


def test_a_bad_only_table_gives_the_heuristic(dirs):
    env, _ = dirs
    put(env, table([entry(2.0, cfg(16))], device=None)).write_text("{not json")
    with pytest.warns(picker.TableWarning, match="not valid JSON"):
        p = pick(16)
    assert p.source == "heuristic" and dict(p.config) == SPEC.default


def test_a_table_for_an_unknown_kernel_is_ignored_with_a_warning(dirs):
    env, _ = dirs
    path = put(env, table([entry(2.0, cfg(16))], device=None))
    path.write_text(path.read_text().replace(f'"kernel": "{KERNEL}"', '"kernel": "nope.kernel"'))
    with pytest.warns(picker.TableWarning, match="unknown kernel"):
        assert pick(16).source == "heuristic"


def test_weird_device_names_never_raise(dirs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = picker.pick_config_with_source(KERNEL, SHAPE, 16, device="../../etc/passwd")
    assert p.source == "heuristic"
    assert any("path separator" in str(w.message) for w in caught)


def test_bad_call_arguments_are_value_errors(dirs):
    with pytest.raises(ValueError, match="routes"):
        pick(-1)
    with pytest.raises(ValueError, match="routes"):
        pick(2.5)
    with pytest.raises(ValueError, match="routes"):
        pick(True)
    with pytest.raises(ValueError, match="unknown kernel"):
        picker.pick_config("nope.kernel", SHAPE, 4, device=H)
    with pytest.raises(ValueError, match="top_k"):
        picker.pick_config(KERNEL, {"E": 8, "N": 64, "K": 128}, 4, device=H)


def test_integer_like_routes_are_accepted(three):
    import numpy as np
    import torch

    assert pick(np.int64(16)) == pick(torch.tensor(16).item()) == pick(16)
    assert pick(torch.tensor(64)).density_key == 8.0


def test_answers_are_cached_until_cleared(dirs):
    env, _ = dirs
    path = put(env, table([entry(2.0, cfg(16))], device=None))
    assert dict(pick(16).config) == cfg(16)
    tables.write(path, table([entry(2.0, cfg(32))], device=None))
    assert dict(pick(16).config) == cfg(16)  # the file is read once
    picker.clear_cache()
    assert dict(pick(16).config) == cfg(32)
