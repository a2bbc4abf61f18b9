"""`python -m ledgerloop.cli`: the `ledgerloop` command."""

from ledgerloop.cli import main

main()
