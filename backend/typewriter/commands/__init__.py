"""One module per `typewriter` subcommand, each with `add_arguments(parser)` and `run(args)`; args.py holds the
options they share."""
