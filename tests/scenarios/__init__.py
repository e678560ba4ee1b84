"""Long, idle scenarios that run in the background of the suite (tests/background.py)."""
