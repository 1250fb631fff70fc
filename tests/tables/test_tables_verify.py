"""moetune verify (library): static checks name file and field; the re-run flags regressions."""

from __future__ import annotations

import pytest
from test_tables_toy import DEVICE, SHAPE, SPEC, cfg, entry, put, table, toy_registered  # noqa: F401

from moetune.tables import format as tables
from moetune.tuner.verify import check_file, recheck, verify


def errors(findings):
    return [(f.field, f.message) for f in findings if f.level == "error"]


def test_a_good_tree_passes(tmp_path):
    put(tmp_path, table([entry(0.5, cfg(16)), entry(8.0, cfg(128))]))
    put(tmp_path, table([entry(0.5, cfg(16))], device=None))
    files, findings = verify([tmp_path])
    assert len(files) == 2 and errors(findings) == []


def test_an_empty_or_tableless_tree_passes(tmp_path):
    (tmp_path / "README.md").write_text("no tables yet")
    assert verify([tmp_path]) == ([], [])


def test_a_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        verify([tmp_path / "nope"])


def test_constraint_violation_names_the_entry(tmp_path):
    # BLOCK_SIZE_M 128 at 0.5 rows per expert: the toy kernel's constraint rejects it
    path = put(tmp_path, table([entry(0.5, cfg(128)), entry(8.0, cfg(128))]))
    _, found = check_file(path)
    assert errors(found)[0][0] == "entries[0].config" and len(errors(found)) == 1
    assert "BLOCK_SIZE_M 128" in errors(found)[0][1]


def test_unknown_config_values_name_the_entry(tmp_path):
    path = put(tmp_path, table([entry(0.5, cfg(16))]))
    path.write_text(path.read_text().replace('"BLOCK_SIZE_K": 128', '"BLOCK_SIZE_X": 128'))
    (finding,) = check_file(path)[1]
    assert (finding.path, finding.field) == (str(path), "entries[0].config")


def test_a_misplaced_file_is_an_error(tmp_path):
    path = put(tmp_path, table([entry(0.5, cfg(16))]))
    moved = path.with_name("E8_N64_K128_topk2_fp16.json")
    path.rename(moved)
    (finding,) = check_file(moved)[1]
    assert finding.field == "(path)" and "nvidia_toy_9000/E8_N64_K128_topk2_bfloat16.json" in finding.message


def test_unknown_kernel_and_bad_shape(tmp_path):
    doc = table([entry(0.5, cfg(16))])
    doc["kernel"] = "nope.kernel"
    path = tmp_path / "x.json"
    path.write_text(tables.dumps(doc))
    assert errors(check_file(path)[1])[0][0] == "kernel"
    doc = table([entry(0.5, cfg(16))], shape={**SHAPE, "colour": "red"})
    path.write_text(tables.dumps(doc))
    assert errors(check_file(path)[1])[0][0] == "shape"


def test_a_stale_default_is_a_warning_not_an_error(tmp_path):
    doc = table([entry(0.5, cfg(16))])
    doc["default"] = cfg(32)
    path = put(tmp_path, doc)
    _, found = check_file(path)
    assert errors(found) == [] and [f.field for f in found] == ["default"]


@pytest.mark.parametrize("text, field", [("{", "(file)"),
                                         ('{"format": "moetune-table", "version": 0}', "version")])
def test_corrupt_files_name_the_field(tmp_path, text, field):
    (tmp_path / "bad.json").write_text(text)
    _, found = verify([tmp_path])
    assert [(f.path, f.field) for f in found] == [(str(tmp_path / "bad.json"), field)]


def fake_measure(times, status=None):
    """A runner stand-in: time per BLOCK_SIZE_M, a fixed spread, optional failing status."""
    calls = []

    def measure(spec, problem, config):
        calls.append((problem.routes, config["BLOCK_SIZE_M"]))
        st = (status or {}).get(config["BLOCK_SIZE_M"], "ok")
        return {"status": st, "error": 0.001 if st == "ok" else 0.5, "time_ms": times[config["BLOCK_SIZE_M"]],
                "spread": 0.02, "reason": None if st == "ok" else "error 0.5 vs reference (1e-2)"}

    measure.calls = calls
    return measure


def test_recheck_flags_regressions_and_inaccuracy(tmp_path):
    doc = table([entry(0.5, cfg(16), routes=4, tokens=2), entry(2.0, cfg(32)), entry(8.0, SPEC.default)])
    path = put(tmp_path, doc)
    ok = fake_measure({16: 1.0, 32: 1.0, 64: 2.0})
    assert recheck(path, doc, ok) == []
    assert (4, 16) in ok.calls and (4, 64) in ok.calls  # the entry's own point, against the default
    slow = recheck(path, doc, fake_measure({16: 1.0, 32: 2.5, 64: 2.0}))
    assert [(f.field, f.level) for f in slow] == [("entries[1].time_ms", "error")]
    bad = recheck(path, doc, fake_measure({16: 1.0, 32: 1.0, 64: 2.0}, status={16: "inaccurate"}))
    assert [f.field for f in bad] == ["entries[0].config"] and "inaccurate" in bad[0].message


def test_verify_re_runs_only_when_asked(tmp_path):
    put(tmp_path, table([entry(2.0, cfg(32))]))
    m = fake_measure({32: 3.0, 64: 2.0})
    _, found = verify([tmp_path], schema_only=True, measure=m)
    assert found == [] and m.calls == []
    _, found = verify([tmp_path], schema_only=False, measure=m)
    assert [f.field for f in found] == ["entries[0].time_ms"]


def test_without_a_device_of_the_arch_the_re_run_is_skipped_with_a_warning(tmp_path):
    put(tmp_path, table([entry(2.0, cfg(32))], device=DEVICE))
    _, found = verify([tmp_path], schema_only=False)  # this machine is the interpreter, the table sm_90
    assert [(f.field, f.level) for f in found] == [("(re-run)", "warning")]



def test_an_entry_recorded_over_the_tolerance_is_an_error(tmp_path):
    path = put(tmp_path, table([entry(0.5, cfg(16)), entry(8.0, cfg(64), error=0.5)]))
    _, found = check_file(path)
    assert [f for f, _ in errors(found)] == ["entries[1].error"]
    assert "tolerance" in errors(found)[0][1]
