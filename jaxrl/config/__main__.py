"""`python -m jaxrl.config show|diff ...`: runs the command of jaxrl/config_cli.py (a command
module; the library package jaxrl.config never imports it)."""
if __name__ == "__main__":
    import sys

    from jaxrl.config_cli import main

    sys.exit(main())
