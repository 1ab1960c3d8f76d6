"""`python -m rankwatch` runs the command-line interface."""

from rankwatch.cli import main

if __name__ == "__main__":
    main(prog_name="rankwatch")
