"""`python -m mltrain ARGS`: the same as the `mltrain` command."""

from ._launch import main

main()
