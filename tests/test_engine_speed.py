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
