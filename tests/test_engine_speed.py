"""The large training files the engine speed benchmark times are valid Python, in
both layouts; the libcst floor beside them runs."""

import ast
import sys

from benchmarks.engine_speed import FLOOR_PASSES, libcst_floor, training_file


def test_large_files_compile_and_the_functions_layout_keeps_each_piece_in_a_function(tmp_path):
    flat = training_file(600, tmp_path)
    nested = training_file(600, tmp_path, in_functions=True)
    assert flat != nested
    flat_tree = ast.parse(flat.read_text(encoding="utf-8"))
    nested_tree = ast.parse(nested.read_text(encoding="utf-8"))
    assert not all(isinstance(s, ast.FunctionDef) for s in flat_tree.body)
    assert all(isinstance(s, ast.FunctionDef) for s in nested_tree.body)
    assert nested.read_text(encoding="utf-8").count("\n") >= 600


def test_the_libcst_floor_times_a_parse_and_each_pass_over_it(tmp_path):
    path = training_file(200, tmp_path)
    parse, *passes = libcst_floor(sys.executable, path, repeats=1)
    assert len(passes) == len(FLOOR_PASSES)
    # each pass parses first, so none can cost less than a parse does (with timer noise)
    assert parse > 0 and all(seconds > parse * 0.5 for seconds in passes)


def test_a_long_file_of_repeated_pieces_is_aligned_line_for_line_without_comparing_it_whole(monkeypatch):
    from codemod import engine

    piece = [f"line {k % 37}" for k in range(300)]  # no line occurs once: nothing anchors the file
    original = piece * 20
    rewritten = list(original)
    for at in (5500, 4000, 2500, 1000, 10):  # five fixes, each adding a line and changing the next
        rewritten[at : at + 1] = ["inserted", "changed"]
    compared: list[int] = []
    real = engine._compared
    monkeypatch.setattr(engine, "_compared", lambda a, b: compared.append(len(a) + len(b)) or real(a, b))
    runs = engine._runs(original, rewritten)
    i = j = 0
    for i1, i2, j1, j2 in runs:  # in order, covering both lists
        assert (i1, j1) == (i, j)
        i, j = i2, j2
    assert (i, j) == (len(original), len(rewritten))
    kept = sum(i2 - i1 for i1, i2, j1, j2 in runs if i2 > i1 and original[i1:i2] == rewritten[j1:j2])
    assert kept == len(original) - 5  # every line but the five changed ones stays in step
    assert max(compared) <= 2 * engine.RESYNC_WINDOW  # difflib sees the changed places, not the file
