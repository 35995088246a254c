"""docs/faults.md lists exactly the fault tests there are (scripts/fault_table.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_docs_faults_md_is_the_table_of_the_fault_tests():
    spec = importlib.util.spec_from_file_location("fault_table", ROOT / "scripts" / "fault_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "docs" / "faults.md").read_text()
    assert module.render(text) == text, "docs/faults.md is stale; run `python scripts/fault_table.py --write`"
    assert len(module.cases()) >= 30 and all(where.count("::test_") == 1 for _, _, where in module.cases())
