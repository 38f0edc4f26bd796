"""One module per ``voxlane`` subcommand: ``add_parser(subparsers)`` and ``run(args) -> int``."""
