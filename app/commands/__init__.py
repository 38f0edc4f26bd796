"""One module per ``voxlane`` subcommand: ``add_parser(subparsers)`` and ``run(args) -> int``, or, for
a command that parses its own arguments (``converse``), ``main(argv) -> int``."""
