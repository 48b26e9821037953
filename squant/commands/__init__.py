"""One module per `squant` subcommand: HELP, add_arguments(parser), run(args)."""
