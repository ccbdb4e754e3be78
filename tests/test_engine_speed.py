"""The large training files the engine speed benchmark times are valid Python, in
both layouts."""

import ast

from benchmarks.engine_speed import training_file


def test_large_files_compile_and_the_functions_layout_keeps_each_piece_in_a_function(tmp_path):
    flat = training_file(600, tmp_path)
    nested = training_file(600, tmp_path, in_functions=True)
    assert flat != nested
    flat_tree = ast.parse(flat.read_text(encoding="utf-8"))
    nested_tree = ast.parse(nested.read_text(encoding="utf-8"))
    assert not all(isinstance(s, ast.FunctionDef) for s in flat_tree.body)
    assert all(isinstance(s, ast.FunctionDef) for s in nested_tree.body)
    assert nested.read_text(encoding="utf-8").count("\n") >= 600
