"""The test tiers themselves: tests/conftest.py run by pytest on a small made-up test tree.

Checks that every test gets exactly one tier from its folder (and `-m unit`
selects by it), that `gpu` tests are skipped with the reason where torch has no CUDA, that a test outside the tier places or with a second tier
stops collection with a message (a `slow` mark on a test of another tier is not a second tier: it leaves
the test to `make test-slow`), that a unit test asking for the bundled model
fails before the model is loaded, and that a unit test writing into the model
cache folder fails.
"""

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
PYTEST_TIMEOUT_S = 300


def make_tree(root: Path, files: dict[str, str]) -> None:
    shutil.copy2(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "tests").mkdir()
    shutil.copy2(TESTS_DIR / "conftest.py", root / "tests" / "conftest.py")
    for name, text in files.items():
        path = root / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args, "tests"],
                          cwd=root, capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S)


def test_each_test_gets_the_tier_of_its_folder(tmp_path):
    make_tree(tmp_path, {
        "unit/test_u.py": """
            def test_u(request):
                assert [m.name for m in request.node.iter_markers()] == ["unit"]
        """,
        "integration/test_i.py": "def test_i():\n    pass\n",
        "browser/test_b.py": "def test_b():\n    pass\n",
        "gpu/test_g.py": "def test_g():\n    pass\n",
        "test_setup_script.py": "def test_s():\n    pass\n",
    })
    everything = run_pytest(tmp_path)
    assert everything.returncode == 0, everything.stdout[-3000:]
    if torch.cuda.is_available():
        assert "5 passed" in everything.stdout
    else:
        assert re.search(r"^SKIPPED \[1\] tests/gpu/test_g\.py: needs a CUDA GPU; this torch has no CUDA$",
                         everything.stdout, re.MULTILINE)
        assert "4 passed, 1 skipped" in everything.stdout
    unit_only = run_pytest(tmp_path, "-m", "unit")
    assert unit_only.returncode == 0, unit_only.stdout[-3000:]
    assert "PASSED tests/unit/test_u.py::test_u" in unit_only.stdout and "1 passed, 4 deselected" in unit_only.stdout


def test_a_long_check_of_a_tier_is_marked_slow_and_left_to_the_slow_run(tmp_path):
    make_tree(tmp_path, {
        "browser/test_long.py": """
            import pytest

            pytestmark = pytest.mark.slow

            def test_long(request):
                assert sorted(m.name for m in request.node.iter_markers()) == ["browser", "slow"]
        """,
        "browser/test_short.py": "def test_short():\n    pass\n",
        "faults/test_cases.py": """
            import pytest

            pytestmark = pytest.mark.integration

            @pytest.mark.parametrize("case", ["kept", pytest.param("long", marks=pytest.mark.slow)])
            def test_case(request, case):
                names = sorted({m.name for m in request.node.iter_markers()} - {"parametrize"})
                assert names == (["integration", "slow"] if case == "long" else ["integration"])
        """,
    })
    default = run_pytest(tmp_path)
    assert default.returncode == 0 and "2 passed, 2 deselected" in default.stdout, default.stdout[-3000:]
    assert "PASSED tests/faults/test_cases.py::test_case[kept]" in default.stdout
    slow = run_pytest(tmp_path, "-m", "slow")
    assert slow.returncode == 0 and "PASSED tests/browser/test_long.py::test_long" in slow.stdout, slow.stdout[-3000:]
    assert "PASSED tests/faults/test_cases.py::test_case[long]" in slow.stdout
    assert "2 passed, 2 deselected" in slow.stdout


def test_a_test_outside_the_tiers_or_with_two_tiers_stops_collection(tmp_path):
    make_tree(tmp_path, {
        "misc/test_m.py": "def test_m():\n    pass\n",
        "unit/test_two.py": """
            import pytest

            @pytest.mark.integration
            def test_two():
                pass
        """,
    })
    result = run_pytest(tmp_path)
    assert result.returncode != 0
    assert "tests/misc/test_m.py::test_m: not in a tier folder" in result.stderr
    assert "tests/unit/test_two.py::test_two: marked integration, unit; a test carries exactly one tier" \
        in result.stderr


def test_unit_tests_cannot_reach_the_bundled_model(tmp_path):
    make_tree(tmp_path, {
        "unit/test_guard.py": """
            import os
            from pathlib import Path

            def test_asks_for_the_model(bundled):
                pass

            def test_asks_for_its_tokenizer(tokenizer):
                pass

            def test_writes_into_the_model_cache():
                (Path(os.environ["KVLAB_CACHE_DIR"]) / "models").mkdir()
        """,
    })
    result = run_pytest(tmp_path)
    assert result.returncode == 1
    assert ("test_asks_for_the_model is a unit test but requests bundled, pool (the real bundled model)"
            in result.stdout)
    assert "test_asks_for_its_tokenizer is a unit test but requests tokenizer" in result.stdout
    assert "a unit test wrote into the model cache (models): it converted or loaded the bundled model" in result.stdout
    assert "1 passed, 3 errors" in result.stdout
