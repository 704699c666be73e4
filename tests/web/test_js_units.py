"""The pane's pure modules (web/runs-model.js, web/format.js, web/args.js) under node's
built-in test runner: one pytest test per JS test file, skipped only when node is missing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

JS_TESTS = sorted((Path(__file__).parent / "js").glob("*.test.mjs"))


@pytest.mark.parametrize("path", JS_TESTS, ids=[p.name for p in JS_TESTS])
def test_pane_module(path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "--test", "--test-reporter=spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_every_js_test_file_is_found() -> None:
    assert len(JS_TESTS) >= 2


WEB = Path(__file__).resolve().parents[2] / "web"


def test_vendored_libraries_carry_their_license_and_version() -> None:
    libraries = [p for p in (WEB / "vendor").iterdir() if p.is_dir()]
    assert libraries
    for lib in libraries:
        assert (lib / "LICENSE").is_file(), f"{lib.name} has no LICENSE"
        assert re.search(r"\d+\.\d+\.\d+", (lib / "README").read_text()), lib.name


def test_the_pane_loads_nothing_from_other_hosts() -> None:
    seen = 0
    for path in WEB.rglob("*.js"):
        imports = re.findall(r"""(?:from|import)\s*\(?\s*["']([^"']+)["']""", path.read_text())
        for target in imports:
            assert target.startswith("."), f"{path.relative_to(WEB)} imports {target}"
        seen += len(imports)
    assert seen > 20  # the pattern finds the imports (minified ones included)
