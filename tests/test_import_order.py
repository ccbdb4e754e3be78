"""The imports a fix adds go where isort (ruff's `I` rules) puts them: into the
block of their section, in order there; the user's own imports stay as written."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import libcst as cst
import pytest

from codemod import imports as import_edits
from codemod.config import Settings
from codemod.edits import AddImport
from codemod.engine import process_source
from codemod.rule import Level

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "fixtures" / "scripts" / "seed_latentwire.py"


def added(source: str, *needed: tuple[str, str | None], first_party=lambda name: False) -> str:
    module = cst.parse_module(source)
    wanted = import_edits.missing(module, [AddImport(m, n) for m, n in needed])
    return import_edits.add(module, wanted, import_edits.import_site(module), first_party).code


def ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed")
    return found


def isort_problems(source: str) -> str:
    """What `ruff check --select I` says of `source`, with ruff's defaults, in a folder
    of no project (this repository's runtime/ would make `runtime` first-party); empty: sorted."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [ruff(), "check", "--isolated", "--select", "I", "--stdin-filename", "train.py", "-"],
            input=source,
            capture_output=True,
            text=True,
            cwd=folder,
        )
    return "" if done.returncode == 0 else done.stdout


def test_new_imports_join_the_third_party_block_in_order():
    source = "import os\nimport time\n\nimport torch\nfrom torch.utils.data import DataLoader\n\nx = 1\n"
    result = added(source, ("runtime.data", "DevicePrefetcher"), ("runtime.amp", "Precision"))
    assert result == (
        "import os\nimport time\n\nimport torch\nfrom runtime.amp import Precision\n"
        "from runtime.data import DevicePrefetcher\nfrom torch.utils.data import DataLoader\n\nx = 1\n"
    )
    assert isort_problems(result) == ""


def test_a_stdlib_import_goes_into_the_stdlib_block_and_first_in_a_section_takes_its_blank_line():
    source = '"""Doc."""\n\nimport os\n\nimport torch\n\nx = 1\n'
    result = added(source, ("contextlib", None), ("math", None))
    assert result == '"""Doc."""\n\nimport contextlib\nimport math\nimport os\n\nimport torch\n\nx = 1\n'
    assert isort_problems(result) == ""


def test_a_section_the_file_lacks_gets_a_block_of_its_own_before_the_project_imports():
    source = "import os\n\nfrom mypackage import model\n\nx = 1\n"
    result = added(source, ("runtime.amp", "Precision"), first_party=lambda name: name == "mypackage")
    assert result == "import os\n\nfrom runtime.amp import Precision\n\nfrom mypackage import model\n\nx = 1\n"
    assert added("import os\nx = 1\n", ("torch", None)) == "import os\n\nimport torch\n\nx = 1\n"


def test_the_users_unsorted_imports_are_not_reordered():
    source = "import torch\nimport numpy as np\n\nx = 1\n"
    result = added(source, ("runtime.amp", "Precision"))
    assert result == "import torch\nimport numpy as np\nfrom runtime.amp import Precision\n\nx = 1\n"


def test_the_names_of_a_new_from_import_are_in_isorts_order():
    result = added("import os\n", ("runtime.data", "default_num_workers"), ("runtime.data", "DevicePrefetcher"))
    assert result == "import os\n\nfrom runtime.data import DevicePrefetcher, default_num_workers\n"


def test_the_seed_scripts_rewrite_passes_ruffs_import_sorting():
    """Run where the project has no `runtime` package of its own (a user's project):
    runtime is a third-party package there, as ruff classifies it."""
    result = process_source(SEED.read_bytes(), "train.py", Settings(level=Level.UNSAFE, root=SEED.parent))
    assert result.error is None
    rewritten = result.new_source.decode()
    assert "from runtime.amp import Precision\n" in rewritten
    assert isort_problems(rewritten) == ""


def test_a_name_joining_a_sorted_from_import_goes_in_order_and_an_unsorted_one_gets_it_last():
    result = added(
        "from torch.utils.data import DataLoader, TensorDataset\n", ("torch.utils.data", "DistributedSampler")
    )
    assert result == "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset\n"
    result = added(
        "from torch.utils.data import TensorDataset, DataLoader\n", ("torch.utils.data", "DistributedSampler")
    )
    assert result == "from torch.utils.data import TensorDataset, DataLoader, DistributedSampler\n"
    result = added("from m import (\n    A,\n    C,\n)\n", ("m", "B"))
    assert result == "from m import (\n    A,\n    B,\n    C,\n)\n"
