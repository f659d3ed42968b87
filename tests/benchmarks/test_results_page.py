"""benchmarks/results_page.py: RESULTS.md is what the stored JSON gives (regenerating changes nothing), every entry's
files exist and say where, when and under which load they ran, and a record formats as its section."""

from __future__ import annotations

import results_page as rp  # benchmarks/ (tests/conftest.py puts it on the path)


def test_results_md_is_up_to_date_with_the_stored_json():
    assert rp.PAGE.read_text() == rp.build_page(), "run: python benchmarks/results_page.py"


def test_check_fails_on_a_stale_page_and_passes_on_a_fresh_one(tmp_path):
    page = tmp_path / "RESULTS.md"
    page.write_text("# an old log\n")
    assert rp.main(["--check", "--out", str(page)]) == 1
    assert rp.main(["--out", str(page)]) == 0
    assert rp.main(["--check", "--out", str(page)]) == 0


def test_every_entry_reads_files_that_exist_and_states_commit_machine_and_load():
    for entry in rp.ENTRIES:
        record = entry.build(*(rp.load(name) for name in entry.files))
        assert record.commit != "not recorded" and record.load != "not recorded", (entry.files, record)
        assert record.machine and record.date and record.gradients and record.rows, entry.files
        assert all(len(row) == len(record.headers) for row in record.rows), entry.files


def test_every_result_file_is_read_by_an_entry():
    read = {name.split("/")[0] for entry in rp.ENTRIES for name in entry.files}
    stored = {p.name for p in rp.RESULTS.iterdir()}
    assert stored <= read, f"no generator entry reads {stored - read}: add one, or delete the file"


def test_provenance_reads_the_environment_a_benchmark_writes():
    env = dict(git_commit="0123456789abcdef", date="2026-12-07T10:00:00+00:00", cpu="Some CPU", cpu_count=2,
               threads=1, torch="2.13.0+cpu", load_avg_1min=0.42, command_line=["/venv/bin/python", "x.py", "--a"])
    got = rp.provenance(dict(environment=env))
    assert got["commit"] == "`0123456`" and got["date"] == "2026-12-07 10:00"
    assert got["load"] == "1-minute load average 0.4 at the start"
    assert got["machine"] == "Some CPU, 2 cores, 1 thread, torch 2.13.0+cpu"
    assert got["command"] == "python x.py --a" and "(transcribed)" not in got["source"]
    transcribed = rp.provenance(dict(environment=env, annotations=dict(transcribed=True, load="quiet", source="log")))
    assert transcribed["load"] == "quiet" and transcribed["source"] == "log (transcribed)"


def test_a_run_py_json_becomes_rows_of_the_training_table():
    def row(config, saved, peak, **extra):
        return dict(model="mlp", config=config, saved_bytes=saved, peak_bytes=peak, grads_matched=True, **extra)

    runs = dict(rows=[row("pytorch_default", 2 * rp.MIB, 4 * rp.MIB),
                      row("fxremat_default", rp.MIB, 3 * rp.MIB, simulated_peak_bytes=3 * rp.MIB, sim_error=0.0)],
                environment=dict(git_commit="abcdef0"))
    steps = dict(rows=[], environment=dict(git_commit="abcdef0"))
    record = rp.training_step(runs, steps)
    assert record.rows == (("mlp", "memory_budget 1.0 (default)", "2.00", "4.00", "1.00", "3.00", "3.00 (+0.0%)", "",
                            ""),)
    assert record.gradients.endswith("2 of 2 rows matched")
    glance = rp.at_a_glance(runs)
    assert glance.rows == (("mlp", "0.50x", "0.75x", "3.00 / 4.00", "0.75x"),)


def test_a_record_formats_as_a_section_with_its_table():
    record = rp.Record(title="T", about="what it is", command="python b.py", commit="`abc1234`", machine="m",
                       load="quiet", date="2026-12-07 10:00", gradients="all matched", headers=("a", "b"),
                       rows=(("1", "2"),), notes=("a note",))
    text = rp.format_record(record)
    assert text.startswith("## T\n\nwhat it is\n")
    assert "| a | b |\n|---|---|\n| 1 | 2 |\n" in text and text.endswith("- a note\n")
    assert "**Commit** `abc1234`" in text and "**load** quiet" in text and "`python b.py`" in text
