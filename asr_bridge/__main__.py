from asr_bridge.cli import main

main()
