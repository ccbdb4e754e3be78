"""CPU smoke test of benchmarks/verify_seed.py (its numbers are owed on a GPU):
copies prepared in one step run in another, and the table comes out."""

from benchmarks import verify_seed


def test_prepared_copies_run_and_print_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    tiny = ["--", "--samples", "16", "--batch-size", "4"]
    assert verify_seed.main(["--prepare-only", str(tmp_path), "--level", "safe", *tiny]) == 0
    assert (tmp_path / "original" / "seed_latentwire.py").is_file()
    capsys.readouterr()
    status = verify_seed.main(["--device", "cpu", "--prepared", str(tmp_path), "--steps", "2", "--warmup", "1", *tiny])
    table = capsys.readouterr().out
    assert status == 0, table
    assert table.startswith("Device: CPU; torch ")
    assert "Command: `python -m benchmarks.verify_seed --device cpu --prepared" in table
    assert "| steps/s " in table and "| tokens/s " in table and "| peak memory (process RSS) " in table
    assert "tolerance (safe): exact (bit for bit)" in table and "result: losses agree" in table
