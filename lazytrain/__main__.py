"""`python -m lazytrain CONFIG [overrides]`: see `lazytrain.launch.entrypoint`."""

from lazytrain.launch.entrypoint import main

if __name__ == "__main__":
    main()
