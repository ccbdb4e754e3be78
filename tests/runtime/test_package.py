import ast
import pathlib
import subprocess
import sys

import runtime

RUNTIME_DIR = pathlib.Path(runtime.__file__).parent


def test_import_runtime_does_not_load_torch():
    code = "import sys, runtime; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=RUNTIME_DIR.parent)


def test_exports_resolve():
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None
    assert runtime.Precision is runtime.amp.Precision
    assert runtime.AsyncCheckpointer is runtime.checkpoint.AsyncCheckpointer


def test_runtime_never_imports_codemod():
    for path in RUNTIME_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "codemod" for n in names), path
