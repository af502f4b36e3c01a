"""gpufed's web console: the fleet, its queues and jobs in a browser, read-only, as the identity
of whoever runs it (``gpufed console``; docs/console.md).

:mod:`.reader` reads the hub cluster's API with the user's kubeconfig (the only module that
talks to it), :mod:`.views` turns objects into what each page shows (pure), :mod:`.server` serves
the pages (aiohttp, Jinja2 templates in ``templates/``, a small live-update script in
``static/``).
"""
