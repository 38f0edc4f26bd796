"""Tools that measure the runtime rooms: benchmarks, peers (transformers, llama.cpp), quality
comparisons and WER. Any room may be imported here; nothing in app/, pipeline/ or engine/ imports
this room (only app/cli.py's ``voxlane bench`` names its modules, to run them)."""
