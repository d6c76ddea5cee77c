"""The device scripts in benchmarks/ run only on a GPU machine. Here, on the CPU, their shell must
parse and the Python drivers that sanitize.sh writes must compile, so a typo does not cost a device
call."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _heredocs(text: str) -> list[str]:
    """The bodies of the script's quoted here-documents (<<'EOF' … EOF)."""
    return re.findall(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S)


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.sh")), ids=lambda p: p.name)
def test_device_scripts_parse(script):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    result = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_sanitize_drivers_compile_and_name_known_consan_modes():
    text = (BENCHMARKS / "sanitize.sh").read_text()
    drivers = _heredocs(text)
    assert len(drivers) == 2, "sanitize.sh writes the compute-sanitizer driver and the ConSan driver"
    for i, source in enumerate(drivers):
        compile(source, f"sanitize.sh driver {i}", "exec")
    modes = re.search(r"^MODES = \((.*)\)$", drivers[1], re.M).group(1)
    modes = {m.strip().strip('"') for m in modes.split(",")}
    cases = re.search(r'CONSAN_CASES:-([^}"]*)\}', text).group(1).split()
    assert cases, "no default ConSan cases"
    for case in cases:
        head_dim, mode = case.split("-", 1)
        widths = ("192",) if mode == "mla-train" else ("64", "128", "256")  # MLA's q, k 192 beside v 128
        assert head_dim in widths and mode in modes, f"ConSan case {case!r}"


def test_consan_driver_refuses_an_unknown_mode(tmp_path):
    driver = tmp_path / "consan_driver.py"
    driver.write_text(_heredocs((BENCHMARKS / "sanitize.sh").read_text())[1])
    result = subprocess.run([sys.executable, str(driver), "128", "causl"], capture_output=True, text=True,
                            cwd=BENCHMARKS.parent, env=dict(os.environ, PYTHONPATH=str(BENCHMARKS.parent)))
    assert result.returncode != 0 and "'causl' is not one of" in result.stderr, result.stderr[-500:]


def test_gpu_check_halves_name_existing_files_and_cover_the_suite():
    # PART=1 / PART=2 split tests/ for two device calls: every name in PART_1 must be a test file (a
    # renamed file would otherwise move to the other half unnoticed), and the halves cover tests/.
    text = (BENCHMARKS / "gpu_check.sh").read_text()
    part_1 = set(re.search(r'PART_1="([^"]*)"', text).group(1).split())
    files = {p.name for p in (BENCHMARKS.parent / "tests").glob("test_*.py")}
    assert part_1 and part_1 <= files, sorted(part_1 - files)
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    block = re.search(r"^PART_1=.*?^fi$", text, re.S | re.M).group(0)
    halves = []
    for part in ("1", "2"):
        out = subprocess.run([bash, "-c", block + '\necho "$TESTS"'], capture_output=True, text=True,
                             cwd=BENCHMARKS.parent,
                             env={**{k: v for k, v in os.environ.items() if k != "TESTS"}, "PART": part})
        halves.append({Path(t).name for t in out.stdout.split()})
    assert halves[0] == part_1 and halves[0] | halves[1] == files and not halves[0] & halves[1]
