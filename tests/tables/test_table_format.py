"""The table format: names, strict parsing, schema, stable text, atomic writes, merging."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_tables_toy import DEVICE, KERNEL, SHAPE, cfg, entry, table, toy_registered  # noqa: F401

from moetune.tables import format as tables
from moetune.tuner.verify import verify

REPO = Path(__file__).resolve().parents[2]


def test_shape_stem_is_stable_and_documented_form():
    assert tables.shape_stem(SHAPE) == "E8_N64_K128_topk2_bfloat16"
    assert tables.shape_stem(dict(reversed(list(SHAPE.items())))) == "E8_N64_K128_topk2_bfloat16"
    odd = {**SHAPE, "swiglu_limit": 7.0, "gated": True, "act": "gelu tanh"}
    assert tables.shape_stem(odd) == "E8_N64_K128_topk2_gelu-tanh_bfloat16_gatedtrue_swiglu-limit7.0"


def test_table_paths_for_arch_and_device(tmp_path):
    arch = tables.table_path(tmp_path, "sm_90", KERNEL, SHAPE)
    dev = tables.table_path(tmp_path, "sm_90", KERNEL, SHAPE, device="NVIDIA H200")
    assert arch == tmp_path / "sm_90" / KERNEL / "E8_N64_K128_topk2_bfloat16.json"
    assert dev == tmp_path / "sm_90" / KERNEL / "nvidia_h200" / "E8_N64_K128_topk2_bfloat16.json"


@pytest.mark.parametrize("name", ["../../etc", "a/b", "a\\b", "..", ""])
def test_device_names_that_could_escape_a_path_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="device"):
        tables.table_path(tmp_path, "sm_90", KERNEL, SHAPE, device=name)


@pytest.mark.parametrize("arch", ["../x", "SM_90", "sm 90"])
def test_bad_arch_is_refused(tmp_path, arch):
    with pytest.raises(ValueError, match="arch"):
        tables.table_path(tmp_path, arch, KERNEL, SHAPE)


def test_dumps_is_stable_one_entry_per_line_and_round_trips():
    doc = table([entry(0.5, cfg(16)), entry(4.0, cfg(32), time_ms=1.5)])
    text = tables.dumps(doc)
    assert tables.dumps(tables.loads(text)) == text
    lines = text.splitlines()
    assert sum(line.strip().startswith('{"density"') for line in lines) == 2
    keys = [json.loads("{" + line.strip().rstrip(",") + "}") for line in lines[1:4]]
    assert [list(k)[0] for k in keys] == ["format", "version", "kernel"]
    # insertion order of the input never shows in the text
    shuffled = {k: doc[k] for k in reversed(list(doc))}
    shuffled["entries"] = [dict(reversed(list(e.items()))) for e in doc["entries"]]
    assert tables.dumps(shuffled) == text


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(format="vllm"), "format"),
    (lambda d: d["entries"][0].update(time_ms=-1.0), "entries[0].time_ms"),
    (lambda d: d["entries"][0].update(error=-0.5), "entries[0].error"),
    (lambda d: d["entries"][1].update(density=0.25), "entries[1].density"),
    (lambda d: d["entries"][0].update(speedup=3.0), "entries[0].speedup"),
    (lambda d: d["entries"][0].update(device="Other GPU"), "entries[0].device"),
    (lambda d: d["entries"][0].update(surprise=1), "entries[0]"),
    (lambda d: d["shape"].pop("top_k"), "shape"),
    (lambda d: d.update(device="../evil", device_names=["../evil"]), "device"),
    (lambda d: d.update(device_names=["A", "B"]), "device_names"),
])
def test_validate_names_the_field(mutate, field):
    doc = table([entry(0.5, cfg(16), device=DEVICE), entry(4.0, cfg(32))])
    mutate(doc)
    with pytest.raises(tables.TableError) as info:
        tables.loads(json.dumps(doc), "t.json")
    assert info.value.field == field
    assert str(info.value).startswith("t.json: ")


@pytest.mark.parametrize("text", ["{", '{"format": NaN}', "[1, 2]", '{"a": Infinity}'])
def test_corrupt_or_non_finite_json_is_refused(text):
    with pytest.raises(tables.TableError) as info:
        tables.loads(text, "bad.json")
    assert info.value.path == "bad.json"


def test_nan_inside_an_entry_is_refused():
    text = tables.dumps(table([entry(0.5, cfg(16))])).replace('"time_ms": 1.0', '"time_ms": NaN')
    with pytest.raises(tables.TableError, match="not valid JSON"):
        tables.loads(text)


def test_write_refuses_an_invalid_table_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "t.json"
    good = table([entry(0.5, cfg(16))])
    tables.write(path, good)
    before = path.read_text()
    bad = table([entry(0.5, cfg(16), time_ms=-3.0)])
    with pytest.raises(tables.TableError):
        tables.write(path, bad)
    assert path.read_text() == before


def test_failure_mid_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "t.json"
    tables.write(path, table([entry(0.5, cfg(16))]))
    before = path.read_text()

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        tables.write(path, table([entry(0.5, cfg(32)), entry(8.0, cfg(64))]))
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.json"]  # no temp file left behind


def test_merge_keeps_other_densities_and_says_what_changed():
    old = table([entry(0.5, cfg(16)), entry(2.0, cfg(32)), entry(8.0, cfg(64))])
    new = table([entry(0.5, cfg(16), time_ms=0.9, default_ms=1.8), entry(2.0, cfg(16)),
                 entry(32.0, cfg(128))])
    merged, changes = tables.merge(old, new)
    tables.validate(merged)
    assert [e["density"] for e in merged["entries"]] == [0.5, 2.0, 8.0, 32.0]
    assert merged["entries"][0]["time_ms"] == 0.9
    assert {c.density: c.status for c in changes} == {0.5: "unchanged", 2.0: "changed", 8.0: "kept",
                                                     32.0: "added"}
    changed = next(c for c in changes if c.status == "changed")
    assert changed.old_config == cfg(32) and changed.new_config == cfg(16)


def test_merge_refuses_a_table_of_another_shape():
    old = table([entry(0.5, cfg(16))])
    new = table([entry(0.5, cfg(16))], shape={**SHAPE, "N": 128})
    with pytest.raises(tables.TableError) as info:
        tables.merge(old, new, "x.json")
    assert info.value.field == "shape"


def test_arch_table_merge_lists_every_device_its_entries_came_from():
    old = table([entry(0.5, cfg(16), device="GPU A")], device=None)
    old["device_names"] = ["GPU A"]
    new = table([entry(2.0, cfg(32), device="GPU B")], device=None)
    new["device_names"] = ["GPU B"]
    merged, _ = tables.merge(old, new)
    tables.validate(merged)
    assert merged["device_names"] == ["GPU A", "GPU B"]


def test_everything_committed_under_configs_passes_the_schema_and_constraints():
    files, findings = verify([REPO / "moetune" / "configs"], schema_only=True)
    assert [str(f) for f in findings if f.level == "error"] == []
    assert all(f.suffix == ".json" for f in files)


def test_without_jsonschema_tables_still_load_and_the_rules_still_hold(monkeypatch):
    """A bare GPU image may lack jsonschema: tables load with one warning; format, version and the
    rules a schema cannot state are still enforced."""
    import sys

    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    tables._validator.cache_clear()
    try:
        doc = table([entry(0.5, cfg(16), device=DEVICE), entry(4.0, cfg(32))])
        with pytest.warns(UserWarning, match="jsonschema is not installed"):
            assert tables.loads(json.dumps(doc), "t.json")["entries"][1]["density"] == 4.0
        doc["entries"][1]["density"] = 0.25  # out of order: a rule check, not a schema one
        with pytest.raises(tables.TableError) as info:
            tables.loads(json.dumps(doc), "t.json")
        assert info.value.field == "entries[1].density"
        with pytest.raises(tables.TableError, match="format"):
            tables.loads(json.dumps({**doc, "format": "vllm"}), "t.json")
    finally:
        tables._validator.cache_clear()
