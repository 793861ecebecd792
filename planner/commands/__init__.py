"""`planner` sub-commands, one module each.

Every module here defines `register(subparsers)`, which adds its parser and sets
`func=run` on it; `run(args) -> int` returns the exit status. `planner.cli` discovers the
modules, so adding a command means adding a file.
"""
