"""The moto server with local.moto_patches applied: `python -m local.moto_server -H 127.0.0.1 -p 5000`."""

import logging

from local.moto_patches import apply

if __name__ == "__main__":
    apply()
    # No line per request: the local stack polls moto several times a second, and nothing reads the lines.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    from moto.server import main

    main()
