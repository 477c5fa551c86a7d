"""Where the repository's test data lives, for test modules at any depth of tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DEMO = REPO / "kubeproxy" / "examples" / "demo.yaml"
