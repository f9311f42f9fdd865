"""`python -m lazytrain CONFIG [overrides]`: see `lazytrain.program.entrypoint`."""

from lazytrain.program.entrypoint import main

if __name__ == "__main__":
    main()
