"""gpufed.cli: the ``gpufed`` command. Imports every component; nothing imports it."""
