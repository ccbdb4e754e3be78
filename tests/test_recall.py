"""The recall benchmark's own contract: markers, matching, loss comparison, runs."""

import textwrap

from benchmarks.recall import agree, analyse, parse_program, run_program, table
from codemod.result import Level

PROGRAM = textwrap.dedent('''\
    """A copy to the GPU."""
    # wild: runnable
    # wild: compare=final
    import torch
    x = torch.randn(4, pin_memory=True)
    y = x.to(torch.device("cuda"))  # expect: PM101 fix, PM999 report
    z = x.to(torch.device("cuda"))
''')

NEGATIVE = textwrap.dedent('''\
    """Copies back to the host."""
    # wild: negative PM101
    import torch
    x = torch.randn(4, device="cuda")
    y = x.to("cpu")
    z = torch.randn(4, pin_memory=True).to(torch.device("cuda"))
''')


def test_markers_and_headers_are_read(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(PROGRAM)
    program = parse_program(path)
    assert [(m.code, m.line, m.expects_fix) for m in program.markers] == [("PM101", 6, True), ("PM999", 6, False)]
    assert program.runnable and program.compare_final and not program.negative


def test_a_finding_matches_its_marker_once_and_the_rest_is_unexpected(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(PROGRAM)
    outcome = analyse(parse_program(path))
    pm101 = next(m for m in outcome.program.markers if m.code == "PM101")
    assert pm101.reported and pm101.fixed
    assert len([u for u in outcome.unexpected if " PM101 " in u]) == 1  # line 7: unmarked, within reach but taken
    row = next(r for r in table([outcome], ["PM101"]))
    assert (row.instances, row.reported, row.fixed, row.unexpected) == (1, 1, 1, 1)


def test_findings_in_a_negative_file_are_false_positives_and_their_fixes_wrong(tmp_path):
    path = tmp_path / "n.py"
    path.write_text(NEGATIVE)
    outcome = analyse(parse_program(path))
    assert len(outcome.false_positives) == 1 and "PM101" in outcome.wrong
    row = table([outcome], ["PM101"])[0]
    assert (row.false_positives, row.wrong) == (1, 1)


def test_losses_agree_by_level():
    assert agree([1.0, 0.5], [1.0, 0.5], Level.SAFE, False) == ""
    assert agree([1.0, 0.5], [1.0, 0.5000001], Level.SAFE, False).startswith("step 1")
    assert agree([1.0, 0.5], [1.0, 0.5000001], Level.NUMERIC, False) == ""
    # unsafe fixes may change random streams or data order: the last loss, within 10%
    assert agree([1.0, 0.5], [1.0, 0.6], Level.UNSAFE, False).startswith("last loss")
    assert agree([1.0, 0.5], [1.1, 0.52], Level.UNSAFE, False) == ""
    assert agree([1.0, 0.5], [9.0, 0.52], Level.UNSAFE, True) == ""  # only the last loss, within 10%
    assert agree([1.0], [1.0, 2.0], Level.SAFE, False) == "1 losses -> 2"


def test_a_program_run_gives_its_losses_or_says_why(tmp_path):
    ok, why = run_program(b"print('WILD_LOSSES', [1.5, 0.25])\n", "a.py", 60)
    assert ok == [1.5, 0.25] and why == ""
    failed, why = run_program(b"raise SystemExit('boom')\n", "b.py", 60)
    assert failed is None and "boom" in why
    silent, why = run_program(b"x = 1\n", "c.py", 60)
    assert silent is None and why == "printed no WILD_LOSSES line"


PREFETCHED = textwrap.dedent('''\
    """A pageable loader's batches copied in the step: PM102 pins, PM103 prefetches."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    device = torch.device("cuda")
    model = torch.nn.Linear(4096, 4096).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8192, 4096), torch.randn(8192, 4096)), batch_size=256)
    for x, y in loader:
        x, y = x.to(device), y.to(device)  # expect: PM101 fix
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def test_a_marker_whose_copy_another_rules_fix_does_counts_as_fixed_by_it(tmp_path):
    path = tmp_path / "p.py"
    path.write_text(PREFETCHED)
    marker = analyse(parse_program(path)).program.markers[0]
    assert (marker.reported, marker.fixed, marker.fixed_by) == (True, True, "PM103")
    alone = analyse(parse_program(path), codes=("PM101",)).program.markers[0]
    assert (alone.reported, alone.fixed, alone.fixed_by) == (False, False, "")
