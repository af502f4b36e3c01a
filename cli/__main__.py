"""``python -m gpufed.cli``: the ``gpufed`` command without its console script."""

from gpufed.cli.main import main

main()
