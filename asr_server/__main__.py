"""``python -m asr_server`` is ``asr-server``."""

from asr_server.cli import main

main()
