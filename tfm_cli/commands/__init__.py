"""One module per subcommand: options in, one library call, results out. No tensor math here."""
